import init, { popupMain, popupEvent } from './pkg/imagine_web.js';

const ready = init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) });
chrome.runtime.onMessage.addListener((message) => { ready.then(() => popupEvent(message)); return false; });
ready.then(() => popupMain());
