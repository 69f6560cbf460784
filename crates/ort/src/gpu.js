// Waiting for ORT's GPU: resolves once every command ORT's WebGPU device was given has run, so that
// the buffers it released meanwhile are freed before the next graph allocates its own.
export async function gpuWorkDone() {
  const device = await globalThis.ort?.env?.webgpu?.device;
  if (device?.queue) await device.queue.onSubmittedWorkDone();
}
