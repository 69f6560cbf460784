// How ORT's JSPI build reads an external-data file: it takes `file.slice(offset, offset + length)` for
// each initializer and reads that slice's `stream()`, with a BYOB reader when it can get one. In Chromium
// a BYOB read of an OPFS file's slice in a worker now and then never settles (seen in `bench soak`: the
// worker stays alive and a new read of the same file works). ORT is given a `ChunkedBlob` instead: its
// slices stream as plain (non-byte) streams, so ORT falls back to a default reader.
//
// Each chunk is read into one reused buffer through a read-only `FileSystemSyncAccessHandle` (dedicated
// workers, Chrome 121+), opened for the slice and closed at its end. ORT copies every chunk before it
// asks for the next, so one buffer serves them all. Reading each chunk with `arrayBuffer()` instead left
// a new 8 MiB buffer behind per chunk until the next garbage collection: for the full-size transformer
// that was up to 600 MB of garbage in the renderer while the session was created. Where no access handle
// can be had (no file handle, a page, a writer holding the file), chunks are read with `arrayBuffer()`.
//
// Reads are also paced to the GPU. ORT uploads each initializer it reads through a staging buffer mapped
// at creation and submits the copy without waiting for it. Chromium backs staging buffers with shared
// memory that it reuses only once the GPU process has taken the copy, so when reading runs ahead of the
// GPU process that shared memory grows with the weights (1.7 GB in the renderer for the full-size
// transformer on SwiftShader). So once PACE_BYTES have been read since the GPU queue was last seen idle,
// the next slice waits until the queue has done all the work submitted so far.

const CHUNK_BYTES = 8 << 20;
const PACE_BYTES = 64 << 20;

// The buffer chunks are read into; null while a stream has it (another stream then takes a new one).
let spareChunk = null;

// The queue of the device ORT opens in this worker (it opens its own, see lib.rs), and the bytes read
// since that queue was last seen idle.
let gpuQueue = null;
let readSinceIdle = 0;

function watchGpuDevice() {
  if (typeof GPUAdapter === 'undefined' || GPUAdapter.prototype.requestDevice.watchedByImagine) return;
  const requestDevice = GPUAdapter.prototype.requestDevice;
  const watched = async function (...args) {
    const device = await requestDevice.apply(this, args);
    gpuQueue = device.queue;
    return device;
  };
  watched.watchedByImagine = true;
  GPUAdapter.prototype.requestDevice = watched;
}

async function paceToGpu(bytes) {
  if (gpuQueue && readSinceIdle >= PACE_BYTES) {
    await gpuQueue.onSubmittedWorkDone();
    readSinceIdle = 0;
  }
  readSinceIdle += bytes;
}

export class ChunkedBlob extends Blob {
  #blob;
  #handle;
  #offset;

  /** `blob`, whose bytes are those of `handle`'s file from `offset` on when a handle is given. */
  constructor(blob, handle = null, offset = 0) {
    super();
    this.#blob = blob;
    this.#handle = handle;
    this.#offset = offset;
  }

  get size() {
    return this.#blob.size;
  }

  slice(start = 0, end = this.size) {
    // ORT passes offsets within the file; clamped as Blob.slice would for non-negative ones.
    const from = Math.min(Math.max(start, 0), this.size);
    const to = Math.min(Math.max(end, from), this.size);
    return new ChunkedBlob(this.#blob.slice(from, to), this.#handle, this.#offset + from);
  }

  arrayBuffer() {
    return this.#blob.arrayBuffer();
  }

  stream() {
    const blob = this.#blob;
    const handle = this.#handle;
    const offset = this.#offset;
    let access = null;
    let chunk = null;
    let at = 0;
    const release = () => {
      access?.close();
      access = null;
      if (chunk) spareChunk = chunk;
      chunk = null;
    };
    return new ReadableStream(
      {
        async start() {
          await paceToGpu(blob.size);
          if (!handle || blob.size === 0) return;
          try {
            access = await handle.createSyncAccessHandle({ mode: 'read-only' });
          } catch {
            return; // read with arrayBuffer()
          }
          chunk = spareChunk ?? new ArrayBuffer(CHUNK_BYTES);
          spareChunk = null;
        },
        async pull(controller) {
          if (at >= blob.size) {
            release();
            controller.close();
            return;
          }
          const length = Math.min(CHUNK_BYTES, blob.size - at);
          let bytes;
          if (access) {
            bytes = new Uint8Array(chunk, 0, length);
            try {
              const read = access.read(bytes, { at: offset + at });
              if (read !== length) {
                throw new Error(`the file ended ${offset + at + read} bytes in, ${length - read} bytes early`);
              }
            } catch (e) {
              release();
              throw e;
            }
          } else {
            bytes = new Uint8Array(await blob.slice(at, at + length).arrayBuffer());
          }
          at += length;
          controller.enqueue(bytes);
        },
        cancel: release,
      },
      { highWaterMark: 0 },
    );
  }
}

/** `data` as ORT should get it: an OPFS file handle or a Blob wrapped in a `ChunkedBlob`, anything else
 * (a URL) as it is. */
export async function forOrt(data) {
  watchGpuDevice();
  if (typeof FileSystemFileHandle !== 'undefined' && data instanceof FileSystemFileHandle) {
    return new ChunkedBlob(await data.getFile(), data);
  }
  return data instanceof Blob ? new ChunkedBlob(data) : data;
}
