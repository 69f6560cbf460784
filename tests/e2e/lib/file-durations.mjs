// A `node --test` reporter that prints, once every file has run, how long each test file took (the sum
// of its top-level tests), so that a slow or stuck file stands out in CI's log; and writes the files
// with a failed test, as a JSON list, to $IMAGINE_E2E_FAILED when it is set (xtask runs those again
// alone). `cargo xtask e2e` and `cargo xtask test` use it beside the spec reporter.
import fs from 'node:fs';
import path from 'node:path';

export default async function* fileDurations(source) {
  const files = new Map();
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    const { file, nesting, details } = event.data;
    if (nesting !== 0 || !file) continue;
    const f = files.get(file) ?? { ms: 0, failed: 0 };
    f.ms += details?.duration_ms ?? 0;
    if (event.type === 'test:fail') f.failed += 1;
    files.set(file, f);
  }
  const rows = [...files].map(([file, f]) => {
    const failed = f.failed ? `  (${f.failed} failed)` : '';
    return `  ${(f.ms / 1000).toFixed(1).padStart(7)} s  ${path.basename(file)}${failed}`;
  });
  if (process.env.IMAGINE_E2E_FAILED) {
    const failed = [...files].filter(([, f]) => f.failed).map(([file]) => file);
    fs.writeFileSync(process.env.IMAGINE_E2E_FAILED, JSON.stringify(failed));
  }
  yield `\ne2e: duration of each test file\n${rows.join('\n')}\n`;
}
