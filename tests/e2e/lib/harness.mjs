// Shared helpers for the end-to-end tests (node:test) and the run/bench scripts.
//
// Chromium is Debian's (/usr/lib/chromium/chromium; /usr/bin/chromium is a shell wrapper), driven by
// playwright-core through a persistent context, because extensions only load in one. Without $DISPLAY
// it runs in the new headless mode, which loads extensions; WebGPU is SwiftShader there
// (--enable-unsafe-webgpu is the flag that matters).
//
// Environment:
//   IMAGINE_DIST      the unpacked extension to load (default: <repo>/dist, built by `cargo xtask build`)
//   IMAGINE_PACKS     the fixture packs (default: <repo>/tests/fixtures/packs)
//   IMAGINE_CHROMIUM  the Chromium binary (default: /usr/lib/chromium/chromium)
//   IMAGINE_HEADLESS=1  headless even when $DISPLAY is set
//   IMAGINE_WEBGPU    swiftshader (default: the CPU adapter every machine has) or vulkan (a real GPU
//                     through Vulkan, as on a Linux machine with an NVIDIA GPU and no display)
//
// The helpers are split by what they touch (config, browser, api, opfs, cdp, process, axe); tests and
// scripts import them all from here: `import * as h from '../lib/harness.mjs'`.

export * from './config.mjs';
export * from './browser.mjs';
export * from './api.mjs';
export * from './opfs.mjs';
export * from './cdp.mjs';
export * from './process.mjs';
export * from './axe.mjs';
