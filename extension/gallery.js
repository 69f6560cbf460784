import init, { galleryPageMain, galleryPageEvent, galleryStorageChanged } from './pkg/imagine_web.js';

const ready = init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) });
chrome.runtime.onMessage.addListener((message) => { ready.then(() => galleryPageEvent(message)); return false; });
chrome.storage.onChanged.addListener((changes, area) => { ready.then(() => galleryStorageChanged(changes, area)); });
ready.then(() => galleryPageMain());
