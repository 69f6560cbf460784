// Offscreen document entry: takes the service worker's internal commands (target "offscreen") and leaves
// every other message to the service worker, so it never answers a request meant for it.
import init, { offscreenCommand } from './pkg/imagine_web.js';

const ready = init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) });

chrome.runtime.onMessage.addListener((message, sender, reply) => {
  if (message?.target !== 'offscreen') return false;
  ready.then(() => offscreenCommand(message, sender)).then(reply, (e) => reply({ reply: 'refused', error: String(e) }));
  return true;
});
