// Finding the GPU wherever Chrome offers one, and opening devices ONNX Runtime can use.
//
// Chrome may answer `requestAdapter` with null for one power preference and with the GPU for another:
// on a Linux machine with an NVIDIA H200 and no display, `high-performance` gives null while `low-power`
// gives the H200 (2026-12-02). ONNX Runtime Web's WebGPU EP asks for `high-performance` itself and fails
// on null, so the stage workers also patch `GPU.prototype.requestAdapter` to try the other preferences
// in the same order.

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
    const { adapter } = await requestAnyAdapter(this, options, request);
    if (adapter) adapterOptions.set(adapter, options);
    return adapter;
  };
  // What `requestAnyAdapter` calls, so that it reports the preference that found the adapter.
  anyAdapter.unpatched = request;
  GPU.prototype.requestAdapter = anyAdapter;
}

// ONNX Runtime Web 1.30 turns on its subgroup-matrix kernels (`MatMulNBits`, `MatMul`, `Gemm`) whenever
// its device has `chromium-experimental-subgroup-matrix`, and writes them in the WGSL of newer Chromium
// (`subgroupMatrixLoad<T, row_major>(ptr, offset, stride)`). Chromium 148 takes the older form (a bool
// argument for the layout), so on an H200 with `shader-f16` every image failed in the text encoder's
// first `MatMulNBits` ("Invalid ShaderModule SubgroupMatrixMatMulNBits", 2026-12-03); 156 compiles it.
// So ORT's device gets that feature only where a shader in ORT's form compiles. The shader is tried on a
// device of a second adapter: an adapter gives one device only.

export const SUBGROUP_MATRIX = 'chromium-experimental-subgroup-matrix';

/** A compute shader that loads and stores one subgroup matrix as ORT's kernels do, of the first float
 * configuration the adapter offers (`GPUAdapterInfo.subgroupMatrixConfigs`; f16 only with `withF16`),
 * else f32 8x8; with the `subgroups` extension enabled, as ORT's shaders have it, when `withSubgroups`. */
export function subgroupMatrixProbe(configs = [], withF16 = false, withSubgroups = false) {
  const config = [...configs].find((c) => c.componentType === 'f32' || (withF16 && c.componentType === 'f16'));
  const type = config?.componentType ?? 'f32';
  const [columns, rows] = config ? [config.K, config.M] : [8, 8];
  const enables = [...(type === 'f16' ? ['f16'] : []), ...(withSubgroups ? ['subgroups'] : []), 'chromium_experimental_subgroup_matrix'];
  return `${enables.map((e) => `enable ${e};\n`).join('')}@group(0) @binding(0) var<storage, read_write> data : array<${type}>;
@compute @workgroup_size(64)
fn main() {
  let m = subgroupMatrixLoad<subgroup_matrix_left<${type}, ${columns}, ${rows}>, row_major>(&data, 0, ${columns});
  subgroupMatrixStore<row_major>(&data, 0, m, ${columns});
}
`;
}

/** Whether `code` compiles on `device` without an error. */
export async function compiles(device, code) {
  const info = await device.createShaderModule({ code }).getCompilationInfo();
  return !info.messages.some((m) => m.type === 'error');
}

/** What each adapter found by the patched `requestAdapter` was asked with (to find its GPU again). */
const adapterOptions = new WeakMap();

/** A device of `adapter` for `descriptor`, from `request`. Where `descriptor` asks for `SUBGROUP_MATRIX`,
 * it is kept only if `subgroupMatrixProbe` compiles on a device `openProbe(features)` opens (then
 * destroyed); when no such device opens, it is left out too. */
export async function requestDeviceOrtCanUse(adapter, descriptor = {}, request = adapter.requestDevice.unpatched ?? adapter.requestDevice, openProbe = undefined) {
  const features = [...(descriptor.requiredFeatures ?? [])];
  if (!features.includes(SUBGROUP_MATRIX)) return request.call(adapter, descriptor);
  const probeFeatures = features.filter((f) => f === SUBGROUP_MATRIX || f === 'shader-f16' || f === 'subgroups');
  openProbe ??= async (required) => {
    const other = await navigator.gpu.requestAdapter(adapterOptions.get(adapter) ?? {});
    return other && request.call(other, { requiredFeatures: required });
  };
  let works = false;
  try {
    const probe = await openProbe(probeFeatures);
    if (probe) {
      const probeCode = subgroupMatrixProbe(adapter.info?.subgroupMatrixConfigs, features.includes('shader-f16'), features.includes('subgroups'));
      works = await compiles(probe, probeCode);
      probe.destroy();
    }
  } catch {
    works = false;
  }
  const kept = works ? features : features.filter((f) => f !== SUBGROUP_MATRIX);
  return request.call(adapter, { ...descriptor, requiredFeatures: kept });
}

/** Makes every `requestDevice` in this global (ONNX Runtime's) go through `requestDeviceOrtCanUse`.
 * Idempotent. */
export function openDevicesOrtCanUse() {
  if (typeof GPUAdapter === 'undefined' || GPUAdapter.prototype.requestDevice.unpatched) return;
  const request = GPUAdapter.prototype.requestDevice;
  const usable = function (descriptor = {}) {
    return requestDeviceOrtCanUse(this, descriptor, request);
  };
  usable.unpatched = request;
  GPUAdapter.prototype.requestDevice = usable;
}

// How much GPU memory this browser can have now. WebGPU tells no free-memory figure, so buffers are
// allocated, each cleared so that the driver really backs it, until the GPU refuses one (an
// `out-of-memory` error, or the device lost) or `capBytes` are held; then all of it is freed.

/** `{ heldBytes, refused }`: what `gpu`'s adapter let one device hold, in buffers of `chunkBytes` (or the
 * adapter's `maxBufferSize`, if smaller), up to `capBytes`. */
export async function probeMemory(gpu, capBytes, chunkBytes) {
  const { adapter } = await requestAnyAdapter(gpu);
  if (!adapter) throw new Error('no WebGPU adapter');
  const size = Math.min(chunkBytes, adapter.limits.maxBufferSize);
  const device = await adapter.requestDevice({ requiredLimits: { maxBufferSize: size } });
  let lost = false;
  device.lost.then(() => { lost = true; });
  const buffers = [];
  let refused = false;
  try {
    while ((buffers.length + 1) * size <= capBytes) {
      device.pushErrorScope('out-of-memory');
      device.pushErrorScope('validation');
      const buffer = device.createBuffer({ size, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST });
      const encoder = device.createCommandEncoder();
      encoder.clearBuffer(buffer);
      device.queue.submit([encoder.finish()]);
      const invalid = await device.popErrorScope();
      const outOfMemory = await device.popErrorScope();
      if (invalid || outOfMemory || lost) {
        buffer.destroy();
        refused = true;
        break;
      }
      buffers.push(buffer);
    }
    if (!lost) await device.queue.onSubmittedWorkDone();
  } finally {
    for (const buffer of buffers) buffer.destroy();
    device.destroy();
  }
  return { heldBytes: buffers.length * size, refused: refused || lost };
}
