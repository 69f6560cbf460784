import init, { studioMain, studioEvent, studioStorageChanged } from './pkg/imagine_web.js';

const ready = init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) });
chrome.runtime.onMessage.addListener((message) => { ready.then(() => studioEvent(message)); return false; });
chrome.storage.onChanged.addListener((changes, area) => { ready.then(() => studioStorageChanged(changes, area)); });
ready.then(() => studioMain());
