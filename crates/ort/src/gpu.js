// Waiting for ORT's GPU: resolves once every command ORT's WebGPU device was given has run, so that
// the buffers it released meanwhile are freed before the next graph allocates its own.
export async function gpuWorkDone() {
  const device = await globalThis.ort?.env?.webgpu?.device;
  if (device?.queue) await device.queue.onSubmittedWorkDone();
}

const ARRAYS = {
  float32: Float32Array, float16: Uint16Array, int64: BigInt64Array, uint64: BigUint64Array,
  int32: Int32Array, uint32: Uint32Array, int8: Int8Array, uint8: Uint8Array, bool: Uint8Array,
};

// Read backs go through one staging buffer of at most this many bytes, kept while ORT's device lives
// and reused, a chunk at a time, rather than one the size of each value: Chromium keeps the shared
// memory it mapped for reuse, each size apart (BENCHMARKS.md, "How a stage worker's ORT gets its wasm,
// and the renderer's mapped memory").
const READ_BACK_CHUNK = 16 * 1024 * 1024;
let staging = null;

// A staging buffer of `device` of at least `size` bytes: the one kept, or a larger one in its place.
function stagingBuffer(device, size) {
  if (staging?.device === device && staging.buffer.size >= size) return staging.buffer;
  staging?.buffer.destroy();
  const buffer = device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  staging = { device, buffer };
  return buffer;
}

// `tensor`, an output ORT left on the GPU, read back into `reuse` (an ArrayBuffer of ours) when it is
// large enough, else into a new one, as a CPU tensor; ORT's output is disposed. Reading ORT's outputs
// to the CPU the usual way gives a new array on every run. `chunk` (a multiple of 16) is for tests.
export async function readBack(tensor, reuse, chunk = READ_BACK_CHUNK) {
  const { type, dims } = tensor;
  const length = dims.reduce((a, b) => a * b, 1);
  const bytes = length * ARRAYS[type].BYTES_PER_ELEMENT;
  // ORT's buffers are whole multiples of 16 bytes.
  const size = Math.ceil(bytes / 16) * 16;
  try {
    const device = await globalThis.ort.env.webgpu.device;
    const buffer = stagingBuffer(device, Math.min(size, chunk));
    const array = reuse instanceof ArrayBuffer && reuse.byteLength >= size ? reuse : new ArrayBuffer(size);
    const into = new Uint8Array(array, 0, bytes);
    const step = Math.min(chunk, buffer.size);
    for (let offset = 0; offset < size; offset += step) {
      const span = Math.min(step, size - offset);
      const encoder = device.createCommandEncoder();
      encoder.copyBufferToBuffer(tensor.gpuBuffer, offset, buffer, 0, span);
      device.queue.submit([encoder.finish()]);
      await buffer.mapAsync(GPUMapMode.READ, 0, span);
      into.set(new Uint8Array(buffer.getMappedRange(0, span), 0, Math.min(span, bytes - offset)), offset);
      buffer.unmap();
    }
    return new globalThis.ort.Tensor(type, new ARRAYS[type](array, 0, length), dims);
  } finally {
    tensor.dispose();
  }
}
