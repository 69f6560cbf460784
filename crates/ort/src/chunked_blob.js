// How ORT's JSPI build reads an external-data file: it takes `file.slice(offset, offset + length)` for
// each initializer and reads that slice's `stream()`, with a BYOB reader when it can get one. In Chromium
// a BYOB read of an OPFS file's slice in a worker now and then never settles (seen in `bench soak`: the
// worker stays alive and a new read of the same file works). ORT is given a `ChunkedBlob` instead: its
// slices stream as plain (non-byte) streams, so ORT falls back to a default reader.
//
// Each chunk is read into one reused buffer through a read-only `FileSystemSyncAccessHandle` (dedicated
// workers, Chrome 121+). ORT copies every chunk before it asks for the next, so one buffer serves them
// all. Reading each chunk with `arrayBuffer()` instead left a new 8 MiB buffer behind per chunk until the
// next garbage collection: for the full-size transformer that was up to 600 MB of garbage in the renderer
// while the session was created. A file's access handle is opened at its first slice and kept until
// `closeFiles()` (called once the session is created): ORT takes hundreds of slices of each file, one
// per initializer. Where no access handle can be had (no file handle, a page, a writer holding the file),
// chunks are read with `arrayBuffer()`.
//
// Bytes computed in the worker (`PartsBlob`) are handed over as the `Uint8Array`s they were made in: a
// `Blob` made of them would copy them to the browser process and ORT would read them back from there.
//
// Reads are also paced to the GPU. ORT uploads each initializer it reads through a staging buffer mapped
// at creation and submits the copy without waiting for it. Chromium backs staging buffers with shared
// memory that it reuses only once the GPU process has taken the copy, so when reading runs ahead of the
// GPU process that shared memory grows with the weights (1.7 GB in the renderer for the full-size
// transformer on SwiftShader). So every PACE_BYTES read mark a point in the GPU queue, and the next slice
// after a mark waits until the queue has passed the mark before it: at most about two PACE_BYTES are in
// flight, and reading never waits for the copies it has just submitted. Chromium keeps that shared
// memory, once grown, for the worker's life: with 64 MiB the renderer held 130-215 MB of it while a
// text encoder loaded on an H100 (whose copies take microseconds), so the pace is 32 MiB.

const CHUNK_BYTES = 8 << 20;
const PACE_BYTES = 32 << 20;

// The buffer chunks are read into; null while a stream has it (another stream then takes a new one).
let spareChunk = null;

// The queue of the device ORT opens in this worker (it opens its own, see lib.rs), the bytes read since
// the last mark, and the GPU queue's promise for the work submitted up to that mark.
let gpuQueue = null;
let readSinceMark = 0;
let markDone = null;

function watchGpuDevice() {
  if (typeof GPUAdapter === 'undefined' || GPUAdapter.prototype.requestDevice.watchedByImagine) return;
  const requestDevice = GPUAdapter.prototype.requestDevice;
  const watched = async function (...args) {
    const device = await requestDevice.apply(this, args);
    [gpuQueue, readSinceMark, markDone] = [device.queue, 0, null];
    return device;
  };
  watched.watchedByImagine = true;
  GPUAdapter.prototype.requestDevice = watched;
}

async function paceToGpu(bytes) {
  if (gpuQueue && readSinceMark >= PACE_BYTES) {
    const before = markDone;
    markDone = gpuQueue.onSubmittedWorkDone();
    readSinceMark = 0;
    await before?.catch(() => {}); // a device lost meanwhile has no copies left to wait for
  }
  readSinceMark += bytes;
}

// The read-only access handle of each file handle read so far, until `closeFiles()`.
const accessHandles = new Map();

function accessFor(handle) {
  let access = accessHandles.get(handle);
  if (!access) {
    access = handle.createSyncAccessHandle({ mode: 'read-only' });
    accessHandles.set(handle, access);
    // One that cannot be opened is asked for again by the next slice.
    access.catch(() => accessHandles.get(handle) === access && accessHandles.delete(handle));
  }
  return access;
}

/** Closes the access handles the reads opened: once ORT has created the session (or failed to). */
export async function closeFiles() {
  const open = [...accessHandles.values()];
  accessHandles.clear();
  for (const access of await Promise.allSettled(open)) {
    if (access.status === 'fulfilled') access.value.close();
  }
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
      if (chunk) spareChunk = chunk;
      chunk = null;
    };
    return new ReadableStream(
      {
        async start() {
          await paceToGpu(blob.size);
          if (!handle || blob.size === 0) return;
          try {
            access = await accessFor(handle);
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

/** Bytes in this worker's memory, `parts` (`Uint8Array`s) one after another, as a `Blob` ORT reads
 * without their being copied anywhere first. */
export class PartsBlob extends Blob {
  #parts;
  #starts;
  #start;
  #end;

  /** The bytes of `parts` from `start` to `end`; `starts` is each part's offset in them all. */
  constructor(parts, starts = null, start = 0, end = null) {
    super();
    this.#parts = parts;
    this.#starts = starts ?? parts.reduce((s, p, i) => (s.push(i ? s[i - 1] + parts[i - 1].byteLength : 0), s), []);
    const total = parts.length ? this.#starts[parts.length - 1] + parts[parts.length - 1].byteLength : 0;
    this.#start = start;
    this.#end = end ?? total;
  }

  get size() {
    return this.#end - this.#start;
  }

  slice(start = 0, end = this.size) {
    const from = Math.min(Math.max(start, 0), this.size);
    const to = Math.min(Math.max(end, from), this.size);
    return new PartsBlob(this.#parts, this.#starts, this.#start + from, this.#start + to);
  }

  /** Views of the parts that cover this blob, in order, none over CHUNK_BYTES. */
  *#views() {
    const [starts, parts] = [this.#starts, this.#parts];
    // The last part that starts at or before this blob's start.
    let lo = 0;
    for (let hi = parts.length; hi - lo > 1; ) {
      const mid = (lo + hi) >> 1;
      if (starts[mid] <= this.#start) lo = mid;
      else hi = mid;
    }
    for (let at = this.#start, i = lo; at < this.#end && i < parts.length; i++) {
      const to = Math.min(this.#end, starts[i] + parts[i].byteLength);
      for (; at < to; at = Math.min(to, at + CHUNK_BYTES)) {
        yield parts[i].subarray(at - starts[i], Math.min(to, at + CHUNK_BYTES) - starts[i]);
      }
    }
  }

  async arrayBuffer() {
    const out = new Uint8Array(this.size);
    let at = 0;
    for (const view of this.#views()) {
      out.set(view, at);
      at += view.byteLength;
    }
    return out.buffer;
  }

  stream() {
    const size = this.size;
    const views = this.#views();
    return new ReadableStream(
      {
        start: () => paceToGpu(size),
        pull(controller) {
          const { value, done } = views.next();
          if (done) controller.close();
          else controller.enqueue(value);
        },
      },
      { highWaterMark: 0 },
    );
  }
}

/** `data` as ORT should get it: an OPFS file handle or a Blob wrapped in a `ChunkedBlob`, an array of
 * `Uint8Array`s as a `PartsBlob`, anything else (a URL) as it is. */
export async function forOrt(data) {
  watchGpuDevice();
  if (Array.isArray(data)) return new PartsBlob(data);
  if (typeof FileSystemFileHandle !== 'undefined' && data instanceof FileSystemFileHandle) {
    return new ChunkedBlob(await data.getFile(), data);
  }
  return data instanceof Blob ? new ChunkedBlob(data) : data;
}
