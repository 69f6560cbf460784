// Finding the GPU wherever Chrome offers one. Chrome may answer `requestAdapter` with null for one power
// preference and with the GPU for another: on a Linux machine with an NVIDIA H200 and no display,
// `high-performance` gives null while `low-power` gives the H200 (2026-12-02). ONNX Runtime Web's WebGPU
// EP asks for `high-performance` itself and fails on null, so the stage workers also patch
// `GPU.prototype.requestAdapter` to try the other preferences in the same order.

/** The order tried: the GPU a user most likely wants first, then Chrome's default, then the other. */
export const POWER_PREFERENCES = ['high-performance', undefined, 'low-power'];

/** `{ adapter, powerPreference }`: the first adapter `gpu` gives for `options` with each power preference
 * in turn (the one asked for first, if any); `adapter` is null when none gives one. */
export async function requestAnyAdapter(gpu, options = {}, request = gpu.requestAdapter.unpatched ?? gpu.requestAdapter) {
  const asked = options.powerPreference;
  const order = asked ? [asked, ...POWER_PREFERENCES.filter((p) => p !== asked)] : POWER_PREFERENCES;
  for (const powerPreference of order) {
    const adapter = await request.call(gpu, { ...options, powerPreference });
    if (adapter) return { adapter, powerPreference: powerPreference ?? 'default' };
  }
  return { adapter: null, powerPreference: null };
}

/** Makes every `requestAdapter` in this global (ONNX Runtime's too) fall back as `requestAnyAdapter`
 * does. Idempotent. */
export function findAnyAdapter() {
  if (typeof GPU === 'undefined' || GPU.prototype.requestAdapter.unpatched) return;
  const request = GPU.prototype.requestAdapter;
  const anyAdapter = async function (options = {}) {
    return (await requestAnyAdapter(this, options, request)).adapter;
  };
  // What `requestAnyAdapter` calls, so that it reports the preference that found the adapter.
  anyAdapter.unpatched = request;
  GPU.prototype.requestAdapter = anyAdapter;
}
