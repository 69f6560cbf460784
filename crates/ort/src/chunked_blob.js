// How ORT's JSPI build reads an external-data file: it takes `file.slice(offset, offset + length)` for
// each initializer and reads that slice's `stream()`, with a BYOB reader when it can get one. In Chromium
// a BYOB read of an OPFS file's slice in a worker now and then never settles (seen in `bench soak`: the
// worker stays alive and a new read of the same file works). ORT is given a `ChunkedBlob` instead: its
// slices stream as plain (non-byte) streams, so ORT falls back to a default reader, and each chunk is
// read with `arrayBuffer()`, the way the asyncify build reads whole files.

const CHUNK_BYTES = 8 << 20;

export class ChunkedBlob extends Blob {
  #blob;

  constructor(blob) {
    super();
    this.#blob = blob;
  }

  get size() {
    return this.#blob.size;
  }

  slice(start, end) {
    return new ChunkedBlob(this.#blob.slice(start, end));
  }

  arrayBuffer() {
    return this.#blob.arrayBuffer();
  }

  stream() {
    const blob = this.#blob;
    let at = 0;
    return new ReadableStream(
      {
        async pull(controller) {
          if (at >= blob.size) {
            controller.close();
            return;
          }
          const end = Math.min(at + CHUNK_BYTES, blob.size);
          const chunk = await blob.slice(at, end).arrayBuffer();
          at = end;
          controller.enqueue(new Uint8Array(chunk));
        },
      },
      { highWaterMark: 0 },
    );
  }
}

/** `data` as ORT should get it: a Blob wrapped in a `ChunkedBlob`, anything else as it is. */
export function forOrt(data) {
  return data instanceof Blob ? new ChunkedBlob(data) : data;
}
