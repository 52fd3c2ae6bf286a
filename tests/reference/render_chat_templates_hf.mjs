// Renders the chat-template oracle cases with @huggingface/jinja (the pinned version in
// tests/reference/package.json), as transformers.js does: new Template(src).render(context).
//   node render_chat_templates_hf.mjs NODE_MODULES CASES.json > RESULTS.json
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

const [nodeModules, casesPath] = process.argv.slice(2);
const { Template } = await import(pathToFileURL(path.join(nodeModules, "@huggingface/jinja/dist/index.js")).href);

// @huggingface/jinja's own strftime_now and raise_exception are used; its clock is pinned to
// the case's instant by replacing Date's "now" (the harness runs every renderer with TZ=UTC).
const RealDate = Date;
let fixedNow = 0;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(fixedNow);
    else super(...args);
  }
  static now() { return fixedNow; }
};

const cases = JSON.parse(readFileSync(casesPath, "utf8"));
const results = cases.map((c) => {
  try {
    fixedNow = (c.now ?? 0) * 1000;
    return { ok: true, text: new Template(c.template).render(c.context) };
  } catch (e) {
    return { ok: false, error: String(e && e.message ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(results));
