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

// Read backs and uploads go through one staging buffer each of at most this many bytes, kept while
// ORT's device lives and reused, a chunk at a time, rather than one the size of each value: Chromium
// keeps the shared memory it mapped for reuse, each size apart (BENCHMARKS.md, "How a stage worker's ORT
// gets its wasm, and the renderer's mapped memory").
const CHUNK = 16 * 1024 * 1024;
const staging = { read: null, write: null };

// A staging buffer of `device` to read from or write to the GPU (`mode`), of at least `size` bytes: the
// one kept, or a larger one in its place.
function stagingBuffer(device, mode, size) {
  const kept = staging[mode];
  if (kept?.device === device && kept.buffer.size >= size) return kept.buffer;
  kept?.buffer.destroy();
  const usage = mode === 'read'
    ? GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST
    : GPUBufferUsage.MAP_WRITE | GPUBufferUsage.COPY_SRC;
  const buffer = device.createBuffer({ size, usage });
  staging[mode] = { device, buffer };
  return buffer;
}

// `tensor`, an output ORT left on the GPU, read back into `reuse` (an ArrayBuffer of ours) when it is
// large enough, else into a new one, as a CPU tensor; ORT's output is disposed. Reading ORT's outputs
// to the CPU the usual way gives a new array on every run. `chunk` (a multiple of 16) is for tests.
export async function readBack(tensor, reuse, chunk = CHUNK) {
  const { type, dims } = tensor;
  const length = dims.reduce((a, b) => a * b, 1);
  const bytes = length * ARRAYS[type].BYTES_PER_ELEMENT;
  // ORT's buffers are whole multiples of 16 bytes.
  const size = Math.ceil(bytes / 16) * 16;
  try {
    const device = await globalThis.ort.env.webgpu.device;
    const buffer = stagingBuffer(device, 'read', Math.min(size, chunk));
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

// `tensor`, a CPU tensor of more than `chunk` bytes, copied onto ORT's device a chunk at a time, as a
// GPU tensor that ORT reads in place and that frees its buffer when disposed; any other tensor as it is.
// ORT's own upload maps a staging buffer the size of the value, and a value the streamed transformer's
// pieces pass on is 54 MiB at 1024x1024 (float32). Call it while a session holds ORT's device.
export async function upload(tensor, chunk = CHUNK) {
  if (tensor.location !== 'cpu' || tensor.data.byteLength <= chunk) return tensor;
  const from = new Uint8Array(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength);
  const size = Math.ceil(from.byteLength / 16) * 16;
  const device = await globalThis.ort.env.webgpu.device;
  const gpuBuffer = device.createBuffer({
    size,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
  });
  const buffer = stagingBuffer(device, 'write', Math.min(size, chunk));
  const step = Math.min(chunk, buffer.size);
  for (let offset = 0; offset < size; offset += step) {
    const span = Math.min(step, size - offset);
    await buffer.mapAsync(GPUMapMode.WRITE, 0, span);
    new Uint8Array(buffer.getMappedRange(0, span)).set(from.subarray(offset, offset + span));
    buffer.unmap();
    const encoder = device.createCommandEncoder();
    encoder.copyBufferToBuffer(buffer, 0, gpuBuffer, offset, span);
    device.queue.submit([encoder.finish()]);
  }
  return globalThis.ort.Tensor.fromGpuBuffer(gpuBuffer, {
    dataType: tensor.type,
    dims: tensor.dims,
    dispose: () => gpuBuffer.destroy(),
  });
}
