import init, { optionsPageMain, optionsPageEvent } from './pkg/imagine_web.js';

const ready = init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) });
chrome.runtime.onMessage.addListener((message) => { ready.then(() => optionsPageEvent(message)); return false; });
ready.then(() => optionsPageMain());
