// Service worker entry. Listeners must be registered synchronously at top level (and top-level await is
// not allowed in service workers), so they wait for the wasm module inside.
import init, {
  serviceWorkerMessage, serviceWorkerInstalled, serviceWorkerMenuClick, serviceWorkerWake,
  serviceWorkerStartup, serviceWorkerCommand, serviceWorkerNotificationClick, serviceWorkerWindowRemoved,
} from './pkg/imagine_web.js';

const ready = init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) });

// `sidePanel.open()` (Firefox: `sidebarAction.open()`) is allowed only while the user's gesture (menu
// click, shortcut, toolbar button) is being handled: it must be called here, synchronously, before
// anything is awaited (the wasm module may still be loading). Resolves to whether the studio opened;
// Rust falls back to a tab when it did not.
function openStudioPanel(tab) {
  try {
    if (!chrome.sidePanel) return chrome.sidebarAction.open().then(() => true, () => false);
    const windowId = tab?.windowId >= 0 ? tab.windowId : chrome.windows.WINDOW_ID_CURRENT;
    return chrome.sidePanel.open({ windowId }).then(() => true, () => false);
  } catch {
    return Promise.resolve(false);
  }
}

chrome.runtime.onMessage.addListener((message, sender, reply) => {
  ready.then(() => serviceWorkerMessage(message, sender)).then(reply, (e) => reply({ type: 'error', error: String(e) }));
  return true;
});
chrome.runtime.onInstalled.addListener(() => { ready.then(() => serviceWorkerInstalled()); });
chrome.runtime.onStartup.addListener(() => { ready.then(() => serviceWorkerStartup()); });
chrome.alarms.onAlarm.addListener(() => { ready.then(() => serviceWorkerWake()); });
chrome.contextMenus.onClicked.addListener((info, tab) => {
  const panel = openStudioPanel(tab);
  ready.then(() => serviceWorkerMenuClick(info, panel, tab?.incognito === true));
});
chrome.commands.onCommand.addListener((command, tab) => {
  if (command !== 'open-studio') return;
  const panel = openStudioPanel(tab);
  ready.then(() => serviceWorkerCommand(command, panel));
});
// Firefox's toolbar button cannot be set to open the sidebar: while it has no popup (the studio is
// what it opens), its click opens the sidebar here. Chrome opens its side panel by itself.
if (!chrome.sidePanel) chrome.action.onClicked.addListener((tab) => { openStudioPanel(tab); });
// The last private window closing is what forgets the images made from text selected there.
chrome.windows.onRemoved.addListener(() => { ready.then(() => serviceWorkerWindowRemoved()); });
chrome.notifications.onClicked.addListener((id) => {
  const panel = openStudioPanel(undefined);
  ready.then(() => serviceWorkerNotificationClick(id, panel));
});
