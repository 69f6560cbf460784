// ONNX Runtime Web writes a session's profile (Chrome trace events, a JSON array, one event a line) with
// `console.log`, which it binds when it makes its wasm module at the first session. `tapConsoleLog`,
// called before that, lets `endProfiling` take those lines instead of printing them.

let taken = null;

export function tapConsoleLog() {
  if (console.log.tappedByImagine) return;
  const log = console.log;
  const tap = (...args) => (taken ? taken.push(args.join(' ')) : log.apply(console, args));
  tap.tappedByImagine = true;
  console.log = tap;
}

/** Ends `session`'s profile; the trace ORT wrote. */
export async function endProfiling(session) {
  taken = [];
  try {
    session.endProfiling();
    // The array's last line closes it; should the output come late, give it a moment.
    for (let i = 0; i < 40 && taken.at(-1)?.trim() !== ']'; i++) await new Promise((r) => setTimeout(r, 50));
    return taken.join('\n');
  } finally {
    taken = null;
  }
}
