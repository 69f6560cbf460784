// Service worker entry. Listeners must be registered synchronously at top level (and top-level await is
// not allowed in service workers), so they wait for the wasm module inside.
import init, {
  serviceWorkerMessage, serviceWorkerInstalled, serviceWorkerMenuClick, serviceWorkerWake,
} from './pkg/imagine_web.js';

const ready = init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) });

chrome.runtime.onMessage.addListener((message, sender, reply) => {
  ready.then(() => serviceWorkerMessage(message, sender)).then(reply, (e) => reply({ type: 'error', error: String(e) }));
  return true;
});
chrome.runtime.onInstalled.addListener(() => { ready.then(() => serviceWorkerInstalled()); });
chrome.runtime.onStartup.addListener(() => { ready.then(() => serviceWorkerWake()); });
chrome.alarms.onAlarm.addListener(() => { ready.then(() => serviceWorkerWake()); });
chrome.contextMenus.onClicked.addListener((info) => { ready.then(() => serviceWorkerMenuClick(info)); });
