// The official OpenAI Node SDK (npm `openai`, pinned in package.json) against a pdserve router:
// n, best_of, logprobs (completions and chat), echo, batched prompts, penalties, logit bias,
// min_tokens, usage, vLLM's tokenize/detokenize, and the errors (404 unknown model, 400 bad
// values) — each checked against its definition, not against recorded outputs.
//
//   REFERENCE_NODE_MODULES=... node openai_sdk_test.mjs http://HOST:PORT
//
// Run by tests/openai_sdk/run.sh against a `pdserve up` P/D cluster on stories260K; the SDK is
// loaded from REFERENCE_NODE_MODULES (scripts/reference-tools.sh tests/openai_sdk installs it
// outside the checkout). Prints one PASS/FAIL line per check and exits non-zero if any failed.
import { createRequire } from 'node:module';

const modules = process.env.REFERENCE_NODE_MODULES;
if (!modules) {
  console.error('REFERENCE_NODE_MODULES is not set: eval "$(scripts/reference-tools.sh tests/openai_sdk)"');
  process.exit(2);
}
const { OpenAI } = createRequire(`${modules}/`)('openai');

const base = process.argv[2];
if (!base) {
  console.error('usage: node openai_sdk_test.mjs http://HOST:PORT');
  process.exit(2);
}
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const prompt = 'Once upon a time, there was a little dog named Max. Max liked to';
const prompt2 = 'Lily and Tom went to the park. They saw';
// stories260K is a llama2.c checkpoint: generation ends when the model emits BOS (1), as in
// llama2.c's own loop (engine/model/llama2c_checkpoint.cc).
const kEos = 1;

let failed = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`PASS ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  }
}
function assert(cond, what) {
  if (!cond) throw new Error(what);
}
function eq(a, b, what) {
  const ja = JSON.stringify(a), jb = JSON.stringify(b);
  if (ja !== jb) throw new Error(`${what}: ${ja} != ${jb}`);
}
async function post(path, body) {
  const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}
// The error the SDK throws for a request, or a failure if it succeeded.
async function error_of(promise) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  throw new Error('the request succeeded');
}

const models = await client.models.list();
const model = models.data[0].id;
const greedy = { model, temperature: 0, max_tokens: 16 };
const complete = (extra) => client.completions.create({ ...greedy, prompt, ...extra });
const chat = (extra) =>
  client.chat.completions.create({ ...greedy, messages: [{ role: 'user', content: prompt }], ...extra });

await check('n=2: two choices, indices 0 and 1, each equal to a single request with seed + i', async () => {
  const sampled = { prompt, model, max_tokens: 16, temperature: 1, seed: 1234 };
  const r = await client.completions.create({ ...sampled, n: 2 });
  eq(r.choices.map((c) => c.index), [0, 1], 'indices');
  let tokens = 0, promptTokens = 0;
  for (const i of [0, 1]) {
    const single = await client.completions.create({ ...sampled, seed: 1234 + i });
    eq(r.choices[i].text, single.choices[0].text, `choice ${i} vs seed ${1234 + i}`);
    tokens += single.usage.completion_tokens;
    promptTokens = single.usage.prompt_tokens;
  }
  assert(r.choices[0].text !== r.choices[1].text, 'the two samples are the same text');
  eq(r.usage.completion_tokens, tokens, 'completion tokens summed over choices');
  eq(r.usage.prompt_tokens, promptTokens, 'prompt tokens counted once');
});

await check('n=2 streaming: chunks tagged with their index give the non-streaming choices', async () => {
  const sampled = { prompt, model, max_tokens: 12, temperature: 1, seed: 77, n: 2 };
  const whole = await client.completions.create(sampled);
  const stream = await client.completions.create({ ...sampled, stream: true, stream_options: { include_usage: true } });
  const text = ['', ''];
  const finish = [null, null];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text[c.index] += c.text;
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  eq(text, whole.choices.map((c) => c.text), 'streamed texts');
  assert(finish.every((f) => f), `every choice finished: ${finish}`);
  eq(usage.completion_tokens, whole.usage.completion_tokens, 'streamed usage');
  const cstream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: prompt }], max_tokens: 8, temperature: 1, seed: 5, n: 2, stream: true,
  });
  const roles = new Set();
  for await (const chunk of cstream) for (const c of chunk.choices) if (c.delta.role) roles.add(c.index);
  eq([...roles].sort(), [0, 1], 'chat: each choice opens with the role');
});

await check('best_of=3: the sample with the highest cumulative logprob', async () => {
  const sampled = { prompt, model, max_tokens: 8, temperature: 1, seed: 900 };
  const best = await client.completions.create({ ...sampled, best_of: 3, n: 1 });
  eq(best.choices.length, 1, 'one choice');
  assert(best.choices[0].logprobs === null, 'no logprobs when not asked');
  let top = null;
  for (let i = 0; i < 3; i++) {
    const s = await client.completions.create({ ...sampled, seed: 900 + i, logprobs: 0 });
    const sum = s.choices[0].logprobs.token_logprobs.reduce((a, b) => a + b, 0);
    if (top === null || sum > top.sum) top = { sum, text: s.choices[0].text };
  }
  assert(top.sum < 0, `the samples' log-probabilities are real (sum ${top.sum})`);
  eq(best.choices[0].text, top.text, 'best_of picked');
});

await check('completions logprobs=2: two alternatives, logprob <= 0, greedy token is the top-1', async () => {
  const r = await complete({ logprobs: 2 });
  const lp = r.choices[0].logprobs;
  const n = r.usage.completion_tokens;
  eq([lp.tokens.length, lp.token_logprobs.length, lp.top_logprobs.length, lp.text_offset.length], [n, n, n, n], 'lengths');
  eq(lp.tokens.join(''), r.choices[0].text, 'tokens spell the text');
  for (let i = 0; i < n; i++) {
    const top = Object.entries(lp.top_logprobs[i]);
    eq(top.length, 2, `top_logprobs[${i}] entries`);
    assert(lp.token_logprobs[i] <= 0, `token_logprobs[${i}] = ${lp.token_logprobs[i]} > 0`);
    const [bestText, bestLp] = top.reduce((a, b) => (b[1] > a[1] ? b : a));
    eq(bestText, lp.tokens[i], `greedy token ${i} is the top-1`);
    assert(Math.abs(bestLp - lp.token_logprobs[i]) < 1e-5, `top-1 logprob ${bestLp} vs ${lp.token_logprobs[i]}`);
    if (i > 0) assert(lp.text_offset[i] > lp.text_offset[i - 1] || lp.tokens[i - 1] === '', 'text_offset grows');
  }
});

await check('chat top_logprobs=2: content entries with two alternatives, greedy token first', async () => {
  const r = await chat({ logprobs: true, top_logprobs: 2 });
  const content = r.choices[0].logprobs.content;
  eq(content.length, r.usage.completion_tokens, 'one entry per token');
  eq(content.map((c) => c.token).join(''), r.choices[0].message.content, 'tokens spell the message');
  for (const c of content) {
    eq(c.top_logprobs.length, 2, 'alternatives');
    assert(c.logprob <= 0, `logprob ${c.logprob} > 0`);
    eq(c.top_logprobs[0].token, c.token, 'greedy token is the top-1');
    assert(c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob, 'most likely first');
    eq(Buffer.from(c.bytes).toString('utf8'), c.token, 'bytes');
  }
  const plain = await chat({});
  assert(plain.choices[0].logprobs === null || plain.choices[0].logprobs === undefined, 'no logprobs unless asked');
});

await check('echo: the text begins with the prompt; with logprobs the prompt tokens come first', async () => {
  const r = await complete({ echo: true, max_tokens: 5 });
  const plain = await complete({ max_tokens: 5 });
  eq(r.choices[0].text, prompt + plain.choices[0].text, 'echoed text');
  const l = await complete({ echo: true, max_tokens: 5, logprobs: 1 });
  const lp = l.choices[0].logprobs;
  eq(lp.tokens.length, l.usage.prompt_tokens + l.usage.completion_tokens, 'prompt + output tokens');
  assert(lp.token_logprobs[0] === null, 'the first prompt token has no logprob');
  assert(lp.token_logprobs.slice(1).every((v) => typeof v === 'number' && v <= 0), 'the others have one');
  const stream = await complete({ echo: true, max_tokens: 5, stream: true });
  let first = null, text = '';
  for await (const chunk of stream) for (const c of chunk.choices) {
    if (first === null) first = c.text;
    text += c.text;
  }
  assert(first.startsWith(prompt), `the first chunk carries the prompt: ${JSON.stringify(first)}`);
  eq(text, r.choices[0].text, 'streamed echo');
});

await check('batched prompts: one choice per prompt, in order, each equal to the prompt alone', async () => {
  const r = await complete({ prompt: [prompt, prompt2] });
  eq(r.choices.map((c) => c.index), [0, 1], 'indices');
  const a = await complete({ prompt });
  const b = await complete({ prompt: prompt2 });
  eq(r.choices.map((c) => c.text), [a.choices[0].text, b.choices[0].text], 'texts');
  eq(r.usage.prompt_tokens, a.usage.prompt_tokens + b.usage.prompt_tokens, 'prompt tokens once per prompt');
  const ids = [(await post('/v1/tokenize', { prompt })).body.tokens, (await post('/v1/tokenize', { prompt: prompt2 })).body.tokens];
  const byIds = await complete({ prompt: ids });
  eq(byIds.choices.map((c) => c.text), r.choices.map((c) => c.text), 'token-id batch');
  const n2 = await complete({ prompt: [prompt, prompt2], n: 2, temperature: 1, seed: 3 });
  eq(n2.choices.map((c) => c.index), [0, 1, 2, 3], 'prompt-major indices');
  const alone = await complete({ prompt: prompt2, n: 2, temperature: 1, seed: 3 });
  eq([n2.choices[2].text, n2.choices[3].text], alone.choices.map((c) => c.text), 'second prompt samples');
});

await check('frequency/presence/repetition penalties change greedy output, deterministically', async () => {
  const base = await complete({ max_tokens: 48 });
  for (const p of [{ frequency_penalty: 2 }, { presence_penalty: 2 }, { repetition_penalty: 1.8 }]) {
    const a = await complete({ max_tokens: 48, ...p });
    const b = await complete({ max_tokens: 48, ...p });
    eq(a.choices[0].text, b.choices[0].text, `${JSON.stringify(p)} deterministic`);
    assert(a.choices[0].text !== base.choices[0].text, `${JSON.stringify(p)} changed nothing`);
  }
});

await check('logit_bias: +100 makes every token that id; -100 on the greedy first token changes it', async () => {
  // A token's text after the prompt's last token (a text's first token decodes without its
  // leading space).
  const promptIds = (await post('/v1/tokenize', { prompt })).body.tokens;
  const last = promptIds[promptIds.length - 1];
  const lastText = (await post('/v1/detokenize', { tokens: [last] })).body.prompt;
  const textAfterPrompt = async (id) => (await post('/v1/detokenize', { tokens: [last, id] })).body.prompt.slice(lastText.length);
  const tok = (await post('/v1/tokenize', { prompt: 'Max', add_special_tokens: false })).body.tokens;
  const id = tok[tok.length - 1];
  const idText = await textAfterPrompt(id);
  const r = await complete({ max_tokens: 8, logit_bias: { [id]: 100 }, logprobs: 0 });
  eq(r.usage.completion_tokens, 8, 'tokens');
  eq(r.choices[0].logprobs.tokens, Array(8).fill(idText), `every token is ${id} (${JSON.stringify(idText)})`);
  // The greedy first token: its id found by tokenizing its text (checked by detokenizing it).
  const g = await complete({ max_tokens: 1, logprobs: 0 });
  const firstText = g.choices[0].logprobs.tokens[0];
  // (The tokenizer may put a space before a text, llama2.c's dummy prefix: try it without too.)
  const cands = [];
  for (const text of [firstText, firstText.trimStart()])
    cands.push(...(await post('/v1/tokenize', { prompt: text, add_special_tokens: false })).body.tokens);
  let greedyId = null;
  for (const c of cands) if ((await textAfterPrompt(c)) === firstText) greedyId = c;
  assert(greedyId !== null, `no token id decodes to the greedy first token ${JSON.stringify(firstText)}`);
  const banned = await complete({ max_tokens: 1, logprobs: 0, logit_bias: { [greedyId]: -100 } });
  assert(banned.choices[0].logprobs.tokens[0] !== firstText, 'the banned token was still sampled');
});

await check('min_tokens: the end token is not sampled before it (biased to +100)', async () => {
  const eos = await complete({ max_tokens: 16, logit_bias: { [kEos]: 100 } });
  eq([eos.usage.completion_tokens, eos.choices[0].finish_reason], [0, 'stop'], 'EOS first without min_tokens');
  const min = await complete({ max_tokens: 16, logit_bias: { [kEos]: 100 }, min_tokens: 5 });
  eq([min.usage.completion_tokens, min.choices[0].finish_reason], [5, 'stop'], 'min_tokens then EOS');
});

await check('max_completion_tokens, ignore_eos, skip_special_tokens, seed under greedy', async () => {
  const a = await chat({ max_completion_tokens: 4 });
  eq(a.usage.completion_tokens, 4, 'max_completion_tokens');
  const s = await complete({ max_tokens: 16 });
  const r = await complete({ max_tokens: 16, ignore_eos: true, skip_special_tokens: true, seed: 1 });
  eq(r.choices[0].text, s.choices[0].text, 'greedy unchanged');
});

await check('tokenize / detokenize (vLLM extras)', async () => {
  const t = await post('/v1/tokenize', { prompt, model });
  eq(t.status, 200, 'status');
  eq(t.body.count, t.body.tokens.length, 'count');
  assert(t.body.max_model_len > 0, 'max_model_len');
  eq(t.body.tokens[0], 1, 'BOS first');
  const d = await post('/v1/detokenize', { tokens: t.body.tokens.slice(1), model });
  eq(d.body.prompt.trim(), prompt, 'round trip');
  const m = await post('/v1/tokenize', { messages: [{ role: 'user', content: 'Hi' }] });
  eq(m.status, 200, 'messages');
  eq((await post('/v1/tokenize', { prompt, model: 'no-such-model' })).status, 404, 'unknown model');
  eq((await post('/v1/detokenize', { tokens: [100000] })).status, 400, 'out of the vocabulary');
});

await check('unknown model: 404', async () => {
  const e = await error_of(client.completions.create({ model: 'no-such-model', prompt, max_tokens: 2 }));
  eq(e.status, 404, 'completions');
  const c = await error_of(client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }));
  eq(c.status, 404, 'chat');
});

await check('bad values: 400 naming the field', async () => {
  const cases = [
    [() => complete({ logprobs: 21 }), 'logprobs'],
    [() => complete({ frequency_penalty: 3 }), 'frequency_penalty'],
    [() => complete({ presence_penalty: -3 }), 'presence_penalty'],
    [() => complete({ n: 0 }), "'n'"],
    [() => complete({ n: 2, best_of: 1 }), 'best_of'],
    [() => complete({ logit_bias: { abc: 1 } }), 'logit_bias'],
    [() => complete({ suffix: 'x' }), 'suffix'],
    [() => chat({ logprobs: true, top_logprobs: 21 }), 'top_logprobs'],
    [() => chat({ top_logprobs: 2 }), 'top_logprobs'],
    [() => complete({ logit_bias: { 100000: 1 } }), 'logit_bias'],
  ];
  for (const [make, field] of cases) {
    const e = await error_of(make());
    eq(e.status, 400, field);
    assert(String(e.message).includes(field), `the message names ${field}: ${e.message}`);
  }
  // Unknown fields are accepted (and logged by the router).
  const ok = await complete({ max_tokens: 2, not_a_field: 1 });
  eq(ok.choices.length, 1, 'unknown field accepted');
});

console.log(failed === 0 ? 'ALL PASSED' : `${failed} FAILED`);
process.exit(failed === 0 ? 0 : 1);
