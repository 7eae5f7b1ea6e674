// openai_client_test.mjs - the official `openai` npm package (a real
// third-party client, not our code) against a running gpud-http.
//
//   SWARM_OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 SWARM_OPENAI_KEY=KEY \
//     node tests/integration/openai_client_test.mjs
//
// scripts/setup installs the pinned package into tests/integration/
// node_modules; openai_client_test.sh starts gpud (stories260K) and
// gpud-http with a key file and runs this. Checks, TAP-style: the model
// list; a greedy chat completion (its shape, usage, finish_reason); the
// same request streamed (the deltas concatenated equal the non-streamed
// text, a finish_reason, the usage chunk agrees); log probabilities (the
// same answer, whole and streamed); a plain completion; a prompt scored
// (echo, logprobs, max_tokens 0: its tokens spell it); a prompt of token
// ids (the answer of the text they spell, and that text echoed);
// logit_bias forcing and banning a token; /tokenize and /detokenize with
// plain fetch; n = 3 choices (each the draw of seed + its index);
// embeddings of a string and of an array (float, and the package's own
// default, base64, which it decodes: the same vectors); and errors as the
// package raises them: n = 17 -> 400 (BadRequestError naming n), a wrong key
// -> 401 (AuthenticationError), an unknown model -> 404 (NotFoundError).
// Exit 0 when every check passed, 1 otherwise.
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const baseURL = process.env.SWARM_OPENAI_BASE_URL;
const apiKey = process.env.SWARM_OPENAI_KEY;
if (!baseURL || !apiKey) {
  console.error('usage: SWARM_OPENAI_BASE_URL=... SWARM_OPENAI_KEY=... node openai_client_test.mjs');
  process.exit(2);
}
// no retries: every error must reach the check as the server sent it
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });

let n = 0;
let failed = 0;
async function check(name, fn) {
  n++;
  try {
    await fn();
    console.log(`ok ${n} - ${name}`);
  } catch (e) {
    failed++;
    console.log(`not ok ${n} - ${name}`);
    console.log(String((e && e.stack) || e).split('\n').map((l) => `#   ${l}`).join('\n'));
  }
}

// the status an API call failed with (the package's APIError), or a
// failure when it succeeded
async function rejects(fn, Klass, status) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof Klass, `expected ${Klass.name}, got ${e && e.constructor.name}: ${e}`);
    assert.equal(e.status, status);
    return e;
  }
  assert.fail(`expected ${status}, the call succeeded`);
}

const messages = [{ role: 'user', content: 'Once upon a time there was a little girl' }];
let model = '';
let plain = null;

await check('models.list: at least one model', async () => {
  const list = await client.models.list();
  assert.ok(list.data.length >= 1);
  assert.equal(list.data[0].object, 'model');
  assert.equal(typeof list.data[0].id, 'string');
  model = list.data[0].id;
});

await check('chat.completions.create (greedy): shape, usage, finish_reason', async () => {
  plain = await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0, seed: 7,
  });
  assert.equal(plain.object, 'chat.completion');
  assert.equal(plain.choices.length, 1);
  const c = plain.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
  const u = plain.usage;
  assert.ok(u.prompt_tokens > 0);
  assert.ok(u.completion_tokens > 0 && u.completion_tokens <= 16, `${u.completion_tokens}`);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  if (c.finish_reason === 'length') assert.equal(u.completion_tokens, 16);
});

await check('chat.completions.create stream: the deltas equal the non-streamed text', async () => {
  assert.ok(plain, 'needs the non-streamed reply');
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0, seed: 7, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    for (const ch of chunk.choices) {
      text += ch.delta?.content ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(chunks >= 2, `${chunks} chunks`);
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, plain.choices[0].finish_reason);
  assert.ok(usage, 'a usage chunk (stream_options.include_usage)');
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, plain.usage.prompt_tokens);
});

await check('chat logprobs: the same answer, each token with its alternatives, streamed alike', async () => {
  assert.ok(plain, 'needs the non-streamed reply');
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0, seed: 7, logprobs: true, top_logprobs: 2,
  });
  const c = r.choices[0];
  assert.equal(c.message.content, plain.choices[0].message.content);
  const lp = c.logprobs.content;
  assert.ok(lp.length > 0 && lp.length <= 16, `${lp.length} entries`);
  let bytes = [];
  for (const t of lp) {
    assert.equal(typeof t.token, 'string');
    assert.ok(t.logprob <= 0, `${t.logprob}`);
    assert.equal(t.top_logprobs.length, 2);
    assert.equal(t.top_logprobs[0].token, t.token); // greedy: its own likeliest
    assert.ok(t.top_logprobs[1].logprob <= t.top_logprobs[0].logprob);
    bytes = bytes.concat(t.bytes);
  }
  const spelled = Buffer.from(bytes).toString('utf8');
  assert.ok(spelled.includes(c.message.content), `${JSON.stringify(spelled)}`);
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0, seed: 7, logprobs: true, top_logprobs: 2,
    stream: true,
  });
  const got = [];
  for await (const chunk of stream)
    for (const ch of chunk.choices) got.push(...(ch.logprobs?.content ?? []));
  assert.deepEqual(got, lp);
});

await check('completions.create: a text completion', async () => {
  const r = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0,
  });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 8);
});

await check('completions.create echo, logprobs, max_tokens 0: the prompt scored', async () => {
  const prompt = 'Once upon a time there was a little girl';
  const r = await client.completions.create({
    model, prompt, max_tokens: 0, echo: true, logprobs: 1, temperature: 0,
  });
  const c = r.choices[0];
  assert.equal(c.text, prompt);
  assert.equal(r.usage.completion_tokens, 0);
  const lp = c.logprobs;
  assert.equal(lp.tokens.length, r.usage.prompt_tokens);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 1; i < lp.tokens.length; i++) {
    assert.ok(lp.token_logprobs[i] <= 0, `${lp.token_logprobs[i]}`);
    assert.equal(Object.keys(lp.top_logprobs[i]).length, 1);
  }
  // the prompt's tokens spell it, each at its offset
  assert.equal(lp.tokens.join(''), prompt);
  let at = 0;
  for (let i = 0; i < lp.tokens.length; i++) {
    assert.equal(lp.text_offset[i], at);
    at += lp.tokens[i].length;
  }
});

await check('completions.create with a prompt of token ids: the answer of the text they spell', async () => {
  // stories260K's tokens of "Once upon a time", BOS first
  const ids = [1, 403, 407, 261, 378];
  const text = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0,
  });
  const r = await client.completions.create({ model, prompt: ids, max_tokens: 12, temperature: 0 });
  assert.equal(r.choices[0].text, text.choices[0].text);
  assert.equal(r.usage.prompt_tokens, ids.length);
  const e = await client.completions.create({
    model, prompt: ids, max_tokens: 0, echo: true, temperature: 0,
  });
  assert.equal(e.choices[0].text, 'Once upon a time');
});

await check('logit_bias: +100 forces a token, -100 bans it (completions and chat)', async () => {
  const upon = 407; // stories260K's " upon"
  const r = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 3, temperature: 0.8, logit_bias: { [upon]: 100 },
  });
  assert.equal(r.choices[0].text, ' upon upon upon');
  const plain = await client.completions.create({
    model, prompt: 'Once', max_tokens: 1, temperature: 0,
  });
  assert.equal(plain.choices[0].text, ' upon');
  const banned = await client.completions.create({
    model, prompt: 'Once', max_tokens: 1, temperature: 0, logit_bias: { [upon]: -100 },
  });
  assert.notEqual(banned.choices[0].text, ' upon');
  const c = await client.chat.completions.create({
    model, messages, max_tokens: 2, logit_bias: { [upon]: 100 },
  });
  assert.match(c.choices[0].message.content, /^ ?upon upon$/);
});

await check('/tokenize and /detokenize (plain fetch): the ids of a text and back', async () => {
  const post = async (path, body) => {
    const res = await fetch(baseURL.replace(/\/v1$/, '') + path, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${apiKey}` },
      body: JSON.stringify(body),
    });
    assert.equal(res.status, 200, await res.clone().text());
    return res.json();
  };
  const t = await post('/tokenize', { model, prompt: 'Once upon a time' });
  assert.deepEqual(t.tokens, [1, 403, 407, 261, 378]);
  assert.equal(t.count, 5);
  const d = await post('/detokenize', { model, tokens: t.tokens, skip_special_tokens: true });
  assert.equal(d.prompt, 'Once upon a time');
  assert.equal(d.content, 'Once upon a time');
});

await check('embeddings.create: a string, an array, float and base64 alike', async () => {
  const one = await client.embeddings.create({
    model, input: 'a little girl', encoding_format: 'float',
  });
  assert.equal(one.object, 'list');
  assert.equal(one.data.length, 1);
  const v = one.data[0].embedding;
  assert.ok(Array.isArray(v) && v.length > 0);
  assert.ok(v.every((x) => typeof x === 'number' && Number.isFinite(x)));
  assert.ok(one.usage.prompt_tokens > 0);
  const two = await client.embeddings.create({
    model, input: ['a little girl', 'a big red ball'], encoding_format: 'float',
  });
  assert.equal(two.data.length, 2);
  assert.deepEqual(two.data.map((d) => d.index), [0, 1]);
  assert.deepEqual(two.data[0].embedding, v);
  assert.notDeepEqual(two.data[1].embedding, v);
  // no encoding_format: the package asks for base64 and decodes it
  const b64 = await client.embeddings.create({ model, input: 'a little girl' });
  assert.equal(b64.data[0].embedding.length, v.length);
  for (let i = 0; i < v.length; i++) assert.ok(Math.abs(b64.data[0].embedding[i] - v[i]) < 1e-6);
});

await check('n = 3: three choices, each the draw of seed + its index', async () => {
  const r = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 10, temperature: 1, seed: 9, n: 3,
  });
  assert.equal(r.choices.length, 3);
  let total = 0;
  for (let i = 0; i < 3; i++) {
    assert.equal(r.choices[i].index, i);
    const one = await client.completions.create({
      model, prompt: 'Once upon a time', max_tokens: 10, temperature: 1, seed: 9 + i,
    });
    assert.equal(r.choices[i].text, one.choices[0].text);
    total += one.usage.completion_tokens;
  }
  assert.equal(r.usage.completion_tokens, total);
  const c = await client.chat.completions.create({ model, messages, max_tokens: 4, n: 2 });
  assert.equal(c.choices.length, 2);
});

await check('n = 17: 400 BadRequestError naming the parameter', async () => {
  const e = await rejects(() => client.chat.completions.create({
    model, messages, max_tokens: 4, n: 17,
  }), OpenAI.BadRequestError, 400);
  assert.equal(e.param, 'n');
  assert.equal(typeof e.message, 'string');
});

await check('a wrong key: 401 AuthenticationError', async () => {
  const bad = new OpenAI({ baseURL, apiKey: 'sk-not-the-key', maxRetries: 0 });
  await rejects(() => bad.chat.completions.create({ model, messages, max_tokens: 4 }),
    OpenAI.AuthenticationError, 401);
});

await check('an unknown model: 404 NotFoundError', async () => {
  await rejects(() => client.chat.completions.create({
    model: 'no-such-model', messages, max_tokens: 4,
  }), OpenAI.NotFoundError, 404);
});

console.log(`1..${n}`);
if (failed) console.log(`# ${failed} failed`);
process.exit(failed ? 1 : 0);
