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

// `tensor`, an output ORT left on the GPU, read back into `reuse` (an ArrayBuffer of ours) when it is
// large enough, else into a new one, as a CPU tensor; ORT's output is disposed. Reading ORT's outputs
// to the CPU the usual way gives a new array on every run.
export async function readBack(tensor, reuse) {
  const { type, dims } = tensor;
  const length = dims.reduce((a, b) => a * b, 1);
  const bytes = length * ARRAYS[type].BYTES_PER_ELEMENT;
  // ORT's buffers are whole multiples of 16 bytes.
  const size = Math.ceil(bytes / 16) * 16;
  const device = await globalThis.ort.env.webgpu.device;
  const staging = device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  try {
    const encoder = device.createCommandEncoder();
    encoder.copyBufferToBuffer(tensor.gpuBuffer, 0, staging, 0, size);
    device.queue.submit([encoder.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    const array = reuse instanceof ArrayBuffer && reuse.byteLength >= size ? reuse : new ArrayBuffer(size);
    new Uint8Array(array, 0, bytes).set(new Uint8Array(staging.getMappedRange(), 0, bytes));
    return new globalThis.ort.Tensor(type, new ARRAYS[type](array, 0, length), dims);
  } finally {
    staging.destroy();
    tensor.dispose();
  }
}
