// kvvm serve checked through real OpenAI API clients: the OpenAI Node SDK and LangChain JS,
// at the versions package-lock.json pins, on the demo model (models/kvvm-adder, which answers
// "What is A + B?" with the sum: at temperature 0 every answer is known in advance).
//
// Usage: node tests/clients/conformance.mjs KVVM_BINARY MODEL_DIR
// Prints "ok - NAME" or "not ok - NAME: what differed" per check and a summary line; exits 1
// when any check failed. Needs `npm ci --prefix tests/clients` first.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const packages = ['openai', '@langchain/openai', '@langchain/core'];

// Missing clients are a failure, never a skip: a skipped suite would hide every finding.
for (const name of packages) {
  if (!existsSync(path.join(here, 'node_modules', name, 'package.json'))) {
    console.error(`conformance.mjs: ${path.join(here, 'node_modules', name)} is missing: ` +
      'run `npm ci --prefix tests/clients` first');
    process.exit(1);
  }
}
if (process.argv.length !== 4) {
  console.error('usage: node conformance.mjs KVVM_BINARY MODEL_DIR');
  process.exit(2);
}
const [kvvm, modelDir] = process.argv.slice(2);
const modelId = path.basename(path.resolve(modelDir));  // kvvm serve's default model id

// Imported after the check above, so that a missing install reads as the message above.
const { default: OpenAI, BadRequestError, NotFoundError, RateLimitError } = await import('openai');
const { ChatOpenAI, OpenAI: LangChainOpenAI } = await import('@langchain/openai');

const version = (name) =>
  JSON.parse(readFileSync(path.join(here, 'node_modules', name, 'package.json'), 'utf8')).version;
console.log(`# clients: ${packages.map((name) => `${name} ${version(name)}`).join(', ')}`);

// --- the demo model's questions --------------------------------------------------------------
const question = (a, b) => `What is ${a} + ${b}?`;
const sum = (a, b) => String(a + b);
// The chat template's text for one user message, as a completion prompt (the model's README).
const chatml = (text) => `<|im_start|>user\n${text}<|im_end|>\n<|im_start|>assistant\n`;
const DEMO = [482, 39];  // scripts/run.sh's exchange: 521
// Held-out pairs of the model's eval.json (three-digit operands, where it is reliable).
const BATCH = [[164, 921], [229, 271], [719, 123]];

// --- servers ---------------------------------------------------------------------------------
const servers = [];

// Starts `kvvm serve` on a free port; resolves once it prints the line with its URL.
function startServer(name, extraArgs, dir = modelDir) {
  const args = ['serve', '--model', dir, '--backend', 'cpu', '--port', '0', ...extraArgs];
  const child = spawn(kvvm, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, OPENBLAS_NUM_THREADS: process.env.OPENBLAS_NUM_THREADS ?? '1' },
  });
  const server = { name, child, output: '', exited: null };
  servers.push(server);
  const exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => resolve({ code, signal }));
    child.on('error', (error) => resolve({ code: null, signal: null, error }));
  });
  server.exited = exited;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(
      `${name}: kvvm serve printed no URL in 60 s; its output: ${server.output.trim()}`)), 60_000);
    const read = (data) => {
      server.output += data;
      const url = /http:\/\/[^\s]+/.exec(server.output);
      if (url && !server.url) {
        server.url = url[0];
        clearTimeout(timer);
        resolve(server);
      }
    };
    child.stdout.on('data', read);
    child.stderr.on('data', read);
    exited.then(({ code, signal, error }) => {
      clearTimeout(timer);
      reject(new Error(`${name}: kvvm serve ended before it listened (${error?.message ??
        `exit ${code}, signal ${signal}`}); its output: ${server.output.trim()}`));
    });
  });
}

// SIGTERM drains: the server must then exit 0 by itself.
async function stopServer(server) {
  server.child.kill('SIGTERM');
  let timer;
  const outcome = await Promise.race([
    server.exited,
    new Promise((resolve) => { timer = setTimeout(() => resolve(null), 40_000); }),
  ]);
  clearTimeout(timer);
  if (outcome === null) {
    server.child.kill('SIGKILL');
    throw new Error('still running 40 s after SIGTERM (killed)');
  }
  if (outcome.code !== 0) {
    throw new Error(`exit ${outcome.code}, signal ${outcome.signal} after SIGTERM; its output: ` +
      server.output.trim().split('\n').slice(-5).join(' | '));
  }
}

// No server outlives the suite: not on a crash, nor when CTest's timeout stops it.
const killServers = () => {
  for (const { child } of servers) if (child.exitCode === null) child.kill('SIGKILL');
};
process.on('exit', killServers);
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    console.log(`not ok - the suite ended by ${signal}`);
    process.exit(1);
  });
}

// --- checks ----------------------------------------------------------------------------------
let passed = 0;
let failed = 0;

function describe(error) {
  if (error instanceof OpenAI.APIError) {
    return `${error.constructor.name} (HTTP ${error.status}): ${error.message}`;
  }
  return String(error?.message ?? error).replace(/\s*\n\s*/g, ' ');
}

async function check(name, body) {
  try {
    await body();
    passed += 1;
    console.log(`ok - ${name}`);
  } catch (error) {
    failed += 1;
    console.log(`not ok - ${name}: ${describe(error)}`);
  }
}

const show = (value) => JSON.stringify(value);
function equal(actual, expected, what) {
  if (!Object.is(actual, expected)) {
    throw new Error(`${what}: got ${show(actual)}, expected ${show(expected)}`);
  }
}
function usageAddsUp(usage, what) {
  assert.ok(usage, `${what}: no usage`);
  for (const key of ['prompt_tokens', 'completion_tokens', 'total_tokens']) {
    assert.ok(Number.isInteger(usage[key]) && usage[key] > 0,
      `${what}: usage.${key} is ${show(usage[key])}, not a positive integer`);
  }
  equal(usage.prompt_tokens + usage.completion_tokens, usage.total_tokens,
    `${what}: prompt_tokens + completion_tokens (${usage.prompt_tokens} + ` +
    `${usage.completion_tokens}) against total_tokens`);
}

// The error `promise` rejects with, which must be `Class` with HTTP `status`.
async function refused(promise, Class, status, what) {
  let result;
  try {
    result = await promise;
  } catch (error) {
    if (!(error instanceof Class) || error.status !== status) {
      throw new Error(`${what}: expected ${Class.name} (HTTP ${status}), got ${describe(error)}`);
    }
    // The SDK reads the answer's x-request-id into every error it raises.
    assert.match(String(error.requestID), /^req_[0-9a-f]{24}$/, `${what}: the error's requestID`);
    return error;
  }
  throw new Error(`${what}: expected ${Class.name} (HTTP ${status}), the request succeeded: ` +
    show(result).slice(0, 200));
}

const started = Date.now();
let main;
let overload;
let tools;
const toolModelDir = path.join(here, '..', 'data', 'models', 'qwen3-tiny');
const toolModelId = 'qwen3-tiny';
const demoTemplate = path.join(path.resolve(modelDir), 'chat_template.jinja');
try {
  // The overload server admits one request and queues one more: a burst gets 429s.
  [main, overload, tools] = await Promise.all([
    startServer('main', []),
    startServer('overload', ['--max-running', '1', '--max-queue', '1']),
    // Tool loops need more context than the demo model's 128 tokens: the qwen3-tiny fixture
    // (trained, 512 tokens) through the demo's template, which shows tools in few tokens.
    startServer('tools', ['--chat-template', demoTemplate], toolModelDir),
  ]);
} catch (error) {
  console.log(`not ok - kvvm serve starts: ${describe(error)}`);
  console.log('# 1 check: 0 passed, 1 failed');
  process.exit(1);
}

// maxRetries 0: a refusal must reach the check, not be retried; a hung answer fails its check
// within CTest's timeout.
const client = new OpenAI({ baseURL: `${main.url}/v1`, apiKey: 'none', maxRetries: 0,
  timeout: 20_000 });
const demoMessages = [{ role: 'user', content: question(...DEMO) }];
const demoAnswer = sum(...DEMO);
const demoPrompt = chatml(question(...DEMO));

// OpenAI SDK: models.
await check('openai: models.list() lists the served model', async () => {
  const ids = [];
  for await (const model of client.models.list()) ids.push(model.id);
  assert.ok(ids.includes(modelId), `ids ${show(ids)} lack ${show(modelId)}`);
});
await check('openai: models.retrieve(id) returns the model', async () => {
  const model = await client.models.retrieve(modelId);
  equal(model.id, modelId, 'id');
  equal(model.object, 'model', 'object');
});
await check('openai: models.retrieve("nope") throws NotFoundError (404)', async () => {
  await refused(client.models.retrieve('nope'), NotFoundError, 404, 'models.retrieve("nope")');
});

// OpenAI SDK: chat.
let chatAnswer;
let chatUsage;
await check('openai: chat.completions.create answers the demo sum', async () => {
  const reply = await client.chat.completions.create({ model: modelId, messages: demoMessages,
    temperature: 0, max_tokens: 8 });
  equal(reply.object, 'chat.completion', 'object');
  equal(reply.model, modelId, 'model');
  equal(reply.choices.length, 1, 'choices.length');
  equal(reply.choices[0].message.role, 'assistant', 'choices[0].message.role');
  // The SDK's message type has a refusal field, null when the model did not refuse.
  equal(reply.choices[0].message.refusal, null, 'choices[0].message.refusal');
  chatAnswer = reply.choices[0].message.content;
  equal(chatAnswer, demoAnswer, 'choices[0].message.content');
  equal(reply.choices[0].finish_reason, 'stop', 'choices[0].finish_reason');
  usageAddsUp(reply.usage, 'usage');
  chatUsage = reply.usage;
});

// Every chunk through `chunk.choices[0].delta.content`, as client code reads a stream: a chunk
// with no choices would throw here.
async function streamChat(extra) {
  const stream = await client.chat.completions.create({ model: modelId, messages: demoMessages,
    temperature: 0, max_tokens: 8, stream: true, ...extra });
  const chunks = [];
  let text = '';
  for await (const chunk of stream) {
    chunks.push(chunk);
    // The usage chunk: its choices are empty (checked by the caller).
    if (extra.stream_options?.include_usage && chunk.choices?.length === 0) continue;
    text += chunk.choices[0].delta.content ?? '';
  }
  assert.ok(chunks.length > 0, 'the stream held no chunk');
  equal(chunks[0].choices[0]?.delta?.role, 'assistant', 'the first chunk\'s delta.role');
  const ends = chunks.filter((chunk) => chunk.choices[0]?.finish_reason);
  equal(ends.length, 1, 'chunks with a finish_reason');
  equal(ends[0].choices[0].finish_reason, 'stop', 'finish_reason');
  for (const chunk of chunks) {
    equal(chunk.object, 'chat.completion.chunk', 'a chunk\'s object');
    equal(chunk.id, chunks[0].id, 'a chunk\'s id (the same in every chunk)');
  }
  return { chunks, text, end: chunks.indexOf(ends[0]) };
}

await check('openai: chat streamed: role first, one finish_reason, text equals the whole answer',
  async () => {
    const { chunks, text, end } = await streamChat({});
    equal(text, chatAnswer ?? demoAnswer, 'the concatenated delta.content');
    equal(end, chunks.length - 1, 'index of the finish_reason chunk (the last)');
    const withUsage = chunks.filter((chunk) => chunk.usage);
    equal(withUsage.length, 0, 'chunks with usage when include_usage is not asked');
  });
await check('openai: chat streamed with include_usage: last chunk has usage and choices []',
  async () => {
    const { chunks, text, end } = await streamChat({ stream_options: { include_usage: true } });
    equal(text, chatAnswer ?? demoAnswer, 'the concatenated delta.content');
    const last = chunks[chunks.length - 1];
    equal(end, chunks.length - 2, 'index of the finish_reason chunk (just before the usage)');
    assert.ok(Array.isArray(last.choices), `the last chunk's choices is ${show(last.choices)}`);
    equal(last.choices.length, 0, 'the last chunk\'s choices.length');
    usageAddsUp(last.usage, 'the last chunk\'s usage');
    if (chatUsage) {
      equal(last.usage.prompt_tokens, chatUsage.prompt_tokens, 'usage.prompt_tokens against ' +
        'the unstreamed answer\'s');
      equal(last.usage.completion_tokens, chatUsage.completion_tokens, 'usage.completion_tokens ' +
        'against the unstreamed answer\'s');
    }
    for (const chunk of chunks.slice(0, -1)) {
      equal(chunk.choices.length, 1, 'choices.length of a chunk before the usage chunk');
      // OpenAI's spec: usage is null on every chunk but the last.
      equal(chunk.usage, null, 'usage of a chunk before the usage chunk');
    }
  });

// OpenAI SDK: completions, on the chat template's text of the same question.
let completionText;
await check('openai: completions.create answers the demo sum (prompt as text)', async () => {
  const reply = await client.completions.create({ model: modelId, prompt: demoPrompt,
    temperature: 0, max_tokens: 8 });
  equal(reply.object, 'text_completion', 'object');
  equal(reply.choices.length, 1, 'choices.length');
  completionText = reply.choices[0].text;
  equal(completionText, demoAnswer, 'choices[0].text');
  equal(reply.choices[0].finish_reason, 'stop', 'choices[0].finish_reason');
  usageAddsUp(reply.usage, 'usage');
  // The same tokens as the chat request's: the template's text is what chat encodes.
  if (chatUsage) {
    equal(reply.usage.prompt_tokens, chatUsage.prompt_tokens,
      'usage.prompt_tokens against the chat request\'s');
  }
});
await check('openai: completions streamed: text equals the unstreamed text', async () => {
  const stream = await client.completions.create({ model: modelId, prompt: demoPrompt,
    temperature: 0, max_tokens: 8, stream: true });
  let text = '';
  const finishes = [];
  for await (const chunk of stream) {
    text += chunk.choices[0].text;
    if (chunk.choices[0].finish_reason) finishes.push(chunk.choices[0].finish_reason);
  }
  equal(text, completionText ?? demoAnswer, 'the concatenated text');
  equal(show(finishes), show(['stop']), 'the finish_reasons of the stream');
});
await check('openai: completions with a one-element prompt list gives the same text', async () => {
  const reply = await client.completions.create({ model: modelId, prompt: [demoPrompt],
    temperature: 0, max_tokens: 8 });
  equal(reply.choices.length, 1, 'choices.length');
  equal(reply.choices[0].text, completionText ?? demoAnswer, 'choices[0].text');
});

// OpenAI SDK: several choices, log-probabilities, echo, a list of prompts.
await check('openai: chat n: 3 greedy gives three equal choices indexed 0..2', async () => {
  const reply = await client.chat.completions.create({ model: modelId, messages: demoMessages,
    temperature: 0, max_tokens: 8, n: 3 });
  equal(reply.choices.length, 3, 'choices.length');
  reply.choices.forEach((choice, i) => {
    equal(choice.index, i, `choices[${i}].index`);
    equal(choice.message.content, demoAnswer, `choices[${i}].message.content`);
  });
  usageAddsUp(reply.usage, 'usage');
});
await check('openai: chat n: 3 streamed interleaves choices, each ending once', async () => {
  const stream = await client.chat.completions.create({ model: modelId, messages: demoMessages,
    temperature: 0, max_tokens: 8, n: 3, stream: true });
  const texts = ['', '', ''];
  const finishes = [0, 0, 0];
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      texts[choice.index] += choice.delta.content ?? '';
      if (choice.finish_reason) finishes[choice.index] += 1;
    }
  }
  equal(show(texts), show([demoAnswer, demoAnswer, demoAnswer]), 'the texts by index');
  equal(show(finishes), show([1, 1, 1]), 'finish_reasons by index');
});
await check('openai: chat logprobs with top_logprobs 2 lists every token', async () => {
  const reply = await client.chat.completions.create({ model: modelId, messages: demoMessages,
    temperature: 0, max_tokens: 8, logprobs: true, top_logprobs: 2 });
  const content = reply.choices[0].logprobs?.content;
  assert.ok(Array.isArray(content) && content.length > 0, 'logprobs.content is not a list');
  equal(content.map((entry) => entry.token).join(''), reply.choices[0].message.content,
    'the tokens joined');
  for (const entry of content) {
    assert.ok(entry.logprob <= 0, `logprob ${entry.logprob} > 0`);
    equal(entry.top_logprobs.length, 2, 'top_logprobs.length');
    equal(entry.top_logprobs[0].logprob, entry.logprob, 'greedy: the top alternative');
  }
});
await check('openai: completions echo + max_tokens 0 + logprobs scores the prompt', async () => {
  const reply = await client.completions.create({ model: modelId, prompt: demoPrompt,
    max_tokens: 0, echo: true, logprobs: 1 });
  const choice = reply.choices[0];
  const logprobs = choice.logprobs;
  assert.ok(logprobs, 'no logprobs');
  equal(logprobs.tokens.length, reply.usage.prompt_tokens, 'tokens against prompt_tokens');
  equal(logprobs.token_logprobs[0], null, 'the first token\'s log-probability');
  assert.ok(logprobs.token_logprobs.slice(1).every((v) => v <= 0), 'a log-probability > 0');
  equal(logprobs.tokens.join(''), choice.text, 'the tokens joined against the text');
  equal(reply.usage.completion_tokens, 0, 'usage.completion_tokens');
});
await check('openai: completions with two prompts and n: 2 orders by prompt then n', async () => {
  const other = chatml(question(...BATCH[0]));
  const reply = await client.completions.create({ model: modelId, prompt: [demoPrompt, other],
    temperature: 0, max_tokens: 8, n: 2 });
  equal(reply.choices.length, 4, 'choices.length');
  const expected = [demoAnswer, demoAnswer, sum(...BATCH[0]), sum(...BATCH[0])];
  equal(show(reply.choices.map((c) => c.text)), show(expected), 'the texts');
  equal(show(reply.choices.map((c) => c.index)), show([0, 1, 2, 3]), 'the indices');
});

// OpenAI SDK: errors.
await check('openai: max_tokens -1 throws BadRequestError (400) naming the field', async () => {
  const error = await refused(client.chat.completions.create({ model: modelId,
    messages: demoMessages, max_tokens: -1 }), BadRequestError, 400, 'max_tokens -1');
  assert.ok(error.message.includes('max_tokens'), `the message ${show(error.message)} does not ` +
    'name max_tokens');
  equal(error.param, 'max_tokens', 'error.param');
});
await check('openai: an unknown model throws NotFoundError (404), code model_not_found',
  async () => {
    const error = await refused(client.chat.completions.create({ model: 'nope',
      messages: demoMessages, max_tokens: 8 }), NotFoundError, 404, 'model "nope"');
    equal(error.code, 'model_not_found', 'error.code');
  });
await check('openai: overload throws RateLimitError (429) with Retry-After', async () => {
  const busy = new OpenAI({ baseURL: `${overload.url}/v1`, apiKey: 'none', maxRetries: 0,
    timeout: 20_000 });
  // A burst at once: with one running and one queued the rest are refused. The burst is
  // repeated in the unlikely case that every request finished before the next arrived.
  const rounds = 5;
  const burst = 8;
  let limited = [];
  for (let round = 0; round < rounds && limited.length === 0; ++round) {
    const outcomes = await Promise.allSettled(Array.from({ length: burst }, () =>
      busy.chat.completions.create({ model: modelId, messages: demoMessages, temperature: 0,
        max_tokens: 8 })));
    for (const outcome of outcomes) {
      if (outcome.status === 'fulfilled') {
        equal(outcome.value.choices[0].message.content, demoAnswer, 'an admitted answer');
      } else if (outcome.reason instanceof RateLimitError) {
        limited.push(outcome.reason);
      } else {
        throw new Error(`a request of the burst: ${describe(outcome.reason)}`);
      }
    }
  }
  assert.ok(limited.length > 0, `no 429 in ${rounds} bursts of ${burst} requests ` +
    '(--max-running 1 --max-queue 1)');
  for (const error of limited) {
    equal(error.status, 429, 'status');
    const retryAfter = error.headers?.get('retry-after');
    assert.ok(/^[1-9][0-9]*$/.test(retryAfter ?? ''),
      `retry-after header ${show(retryAfter)} is not a whole number of seconds >= 1`);
  }
});

// LangChain.
const chat = new ChatOpenAI({ model: modelId, temperature: 0, maxTokens: 8, apiKey: 'none',
  maxRetries: 0, configuration: { baseURL: `${main.url}/v1` } });
let langchainAnswer;
await check('langchain: ChatOpenAI.invoke answers the demo sum', async () => {
  const message = await chat.invoke(question(...DEMO));
  langchainAnswer = message.content;
  equal(langchainAnswer, demoAnswer, 'content');
  equal(message.response_metadata?.finish_reason, 'stop', 'response_metadata.finish_reason');
  const usage = message.usage_metadata;
  assert.ok(usage, 'no usage_metadata');
  equal(usage.input_tokens + usage.output_tokens, usage.total_tokens,
    'usage_metadata input_tokens + output_tokens against total_tokens');
});
await check('langchain: ChatOpenAI.stream concatenated equals invoke', async () => {
  let text = '';
  let chunks = 0;
  for await (const chunk of await chat.stream(question(...DEMO))) {
    text += chunk.content;
    chunks += 1;
  }
  assert.ok(chunks > 1, `${chunks} chunk(s): the answer did not stream`);
  equal(text, langchainAnswer ?? demoAnswer, 'the concatenated content');
});
await check('langchain: ChatOpenAI.batch of 3 questions answers each', async () => {
  const replies = await chat.batch(BATCH.map(([a, b]) => question(a, b)));
  equal(replies.length, BATCH.length, 'replies');
  replies.forEach((reply, i) => equal(reply.content, sum(...BATCH[i]),
    `reply ${i} (${question(...BATCH[i])})`));
});
await check('langchain: OpenAI (completions).invoke answers the demo sum', async () => {
  const llm = new LangChainOpenAI({ model: modelId, temperature: 0, maxTokens: 8, apiKey: 'none',
    maxRetries: 0, configuration: { baseURL: `${main.url}/v1` } });
  equal(await llm.invoke(demoPrompt), demoAnswer, 'the text');
});

await check('langchain: OpenAI (completions).generate of 3 prompts sends one list', async () => {
  const llm = new LangChainOpenAI({ model: modelId, temperature: 0, maxTokens: 8, apiKey: 'none',
    maxRetries: 0, configuration: { baseURL: `${main.url}/v1` } });
  const result = await llm.generate(BATCH.map(([a, b]) => chatml(question(a, b))));
  equal(result.generations.length, BATCH.length, 'generations');
  result.generations.forEach((generation, i) => equal(generation[0].text, sum(...BATCH[i]),
    `generation ${i}`));
});

// Structured output: response_format json_schema through the SDK's parse() helper and
// LangChain's withStructuredOutput, each answer checked against its zod schema. The sum's
// bounds keep the model's digits few (a bounded integer is a bounded number of digits).
const { z } = await import('zod');
const { zodResponseFormat } = await import('openai/helpers/zod');
const SumAnswer = z.object({ sum: z.number().int().min(0).max(1998) });
function answersSchema(value, what) {
  const checked = SumAnswer.safeParse(value);
  assert.ok(checked.success, `${what}: ${show(value)} does not match the schema: ` +
    `${checked.error?.message}`);
}


await check('openai: chat.completions.parse with zodResponseFormat answers the schema',
  async () => {
    const reply = await client.chat.completions.parse({ model: modelId, messages: demoMessages,
      temperature: 0, max_tokens: 32, response_format: zodResponseFormat(SumAnswer, 'sum') });
    const choice = reply.choices[0];
    equal(choice.finish_reason, 'stop', 'finish_reason');
    assert.ok(choice.message.parsed, `no parsed answer; content ${show(choice.message.content)}`);
    answersSchema(choice.message.parsed, 'message.parsed');
    answersSchema(JSON.parse(choice.message.content), 'message.content');
  });
await check('openai: chat streamed with a json_schema concatenates to the schema',
  async () => {
    const stream = await client.chat.completions.create({ model: modelId,
      messages: demoMessages, temperature: 0, max_tokens: 32, stream: true,
      response_format: zodResponseFormat(SumAnswer, 'sum') });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    answersSchema(JSON.parse(text), 'the concatenated delta.content');
  });
await check('openai: a schema keyword kvvm cannot enforce throws BadRequestError naming the ' +
  'schema', async () => {
  const error = await refused(client.chat.completions.create({ model: modelId,
    messages: demoMessages, max_tokens: 8, response_format: { type: 'json_schema',
      json_schema: { name: 'a', schema: { type: 'object', if: { type: 'object' } } } } }),
  BadRequestError, 400, 'a schema with "if"');
  equal(error.param, 'response_format.json_schema.schema', 'error.param');
});
await check('openai: two constraints throw BadRequestError naming both', async () => {
  const error = await refused(client.chat.completions.create({ model: modelId,
    messages: demoMessages, max_tokens: 8, response_format: zodResponseFormat(SumAnswer, 'sum'),
    guided_regex: '[0-9]+' }), BadRequestError, 400, 'response_format and guided_regex');
  equal(error.param, 'guided_regex', 'error.param');
  assert.ok(error.message.includes('response_format'), `the message ${show(error.message)} ` +
    'does not name response_format');
});
// LangChain's default method for a model it does not know is jsonSchema too; named here.
const structuredChat = new ChatOpenAI({ model: modelId, temperature: 0, maxTokens: 32,
  apiKey: 'none', maxRetries: 0, configuration: { baseURL: `${main.url}/v1` } });
await check('langchain: withStructuredOutput (jsonSchema) answers the zod schema',
  async () => {
    const structured = structuredChat.withStructuredOutput(SumAnswer, { method: 'jsonSchema',
      name: 'sum' });
    answersSchema(await structured.invoke(question(...DEMO)), 'the parsed answer');
  });
await check('langchain: withStructuredOutput (jsonSchema, includeRaw) keeps the raw ' +
  'message', async () => {
  const structured = structuredChat.withStructuredOutput(SumAnswer, { method: 'jsonSchema',
    name: 'sum', includeRaw: true });
  const { raw, parsed } = await structured.invoke(question(...DEMO));
  answersSchema(parsed, 'parsed');
  answersSchema(JSON.parse(raw.content), 'raw.content');
  equal(raw.response_metadata?.finish_reason, 'stop', 'raw.response_metadata.finish_reason');
});

// Tool calls: the demo's template shows tools and tool calls as Qwen2.5's does (<tool_call>
// blocks), so kvvm reads the answers with the hermes parser; with tool_choice required or a
// named function the grammar engine makes every call parse against its schema. Bounded values
// keep a random model's calls short.
const toolClient = new OpenAI({ baseURL: `${tools.url}/v1`, apiKey: 'none', maxRetries: 0,
  timeout: 20_000 });
const AddArgs = z.object({ a: z.number().int(), b: z.number().int() }).strict();
const operand = { type: 'integer', minimum: 0, maximum: 999 };
const addTool = { type: 'function', function: { name: 'add', description: 'Adds two integers',
  parameters: { type: 'object', properties: { a: operand, b: operand }, required: ['a', 'b'],
    additionalProperties: false } } };
const echoTool = { type: 'function', function: { name: 'echo', description: 'Repeats a text',
  parameters: { type: 'object', properties: { text: { type: 'string', maxLength: 12 } },
    required: ['text'], additionalProperties: false } } };
function callsAdd(call, what) {
  equal(call.type, 'function', `${what}.type`);
  equal(call.function.name, 'add', `${what}.function.name`);
  assert.match(call.id, /^call_[A-Za-z0-9]{24}$/, `${what}.id`);
  const args = AddArgs.safeParse(JSON.parse(call.function.arguments));
  assert.ok(args.success, `${what}.function.arguments ${show(call.function.arguments)}: ` +
    `${args.error?.message}`);
  return args.data;
}
await check('openai: tool_choice required always answers calls that parse against the ' +
  'schema (12 seeds, temperature 1)', async () => {
  for (let seed = 0; seed < 12; ++seed) {
    const reply = await toolClient.chat.completions.create({ model: toolModelId, messages: demoMessages,
      tools: [addTool], tool_choice: 'required', parallel_tool_calls: false, temperature: 1,
      seed, max_tokens: 128 });
    const choice = reply.choices[0];
    equal(choice.finish_reason, 'tool_calls', `seed ${seed}: finish_reason`);
    equal(choice.message.content, null, `seed ${seed}: content`);
    equal(choice.message.tool_calls.length, 1, `seed ${seed}: calls`);
    callsAdd(choice.message.tool_calls[0], `seed ${seed}: tool_calls[0]`);
  }
});
await check('openai: a named tool_choice calls that function', async () => {
  const reply = await toolClient.chat.completions.create({ model: toolModelId, messages: demoMessages,
    tools: [addTool, echoTool], tool_choice: { type: 'function', function: { name: 'echo' } },
    temperature: 1, seed: 3, max_tokens: 128 });
  const calls = reply.choices[0].message.tool_calls;
  assert.ok(calls.length >= 1, 'no call');
  for (const call of calls) {
    equal(call.function.name, 'echo', 'function.name');
    assert.equal(typeof JSON.parse(call.function.arguments).text, 'string', 'arguments.text');
  }
});
await check('openai: a tool loop by hand: call, result, answer', async () => {
  const messages = [...demoMessages];
  const first = await toolClient.chat.completions.create({ model: toolModelId, messages,
    tools: [addTool], tool_choice: 'required', parallel_tool_calls: false, temperature: 0,
    max_tokens: 128 });
  const call = first.choices[0].message.tool_calls[0];
  const { a, b } = callsAdd(call, 'the call');
  messages.push(first.choices[0].message);  // content null, tool_calls
  messages.push({ role: 'tool', tool_call_id: call.id, content: String(a + b) });
  const answer = await toolClient.chat.completions.create({ model: toolModelId, messages,
    tools: [addTool], tool_choice: 'none', temperature: 0, max_tokens: 16 });
  const choice = answer.choices[0];
  assert.ok(choice.finish_reason === 'stop' || choice.finish_reason === 'length',
    `finish_reason ${choice.finish_reason}`);
  assert.equal(typeof choice.message.content, 'string', 'the answer is text');
  assert.ok(choice.message.tool_calls === undefined || choice.message.tool_calls.length === 0,
    'no call under tool_choice none');
});
await check('openai: streamed tool calls accumulate (stream().finalChatCompletion()) to the ' +
  'whole answer\'s calls', async () => {
  const body = { model: toolModelId, messages: demoMessages, tools: [addTool, echoTool],
    tool_choice: 'required', temperature: 0, max_tokens: 160 };
  const whole = await toolClient.chat.completions.create(body);
  const stream = toolClient.chat.completions.stream(body);
  const streamed = await stream.finalChatCompletion();
  const strip = (calls) => calls.map((c) => [c.function.name, c.function.arguments]);
  assert.deepEqual(strip(streamed.choices[0].message.tool_calls),
    strip(whole.choices[0].message.tool_calls), 'streamed calls');
  equal(streamed.choices[0].finish_reason, 'tool_calls', 'streamed finish_reason');
});
await check('openai: runTools with a named function calls it once and sends its result',
  async () => {
    let called = 0;
    const runner = toolClient.chat.completions.runTools({ model: toolModelId, messages: demoMessages,
      temperature: 0, max_tokens: 128, tool_choice: { type: 'function', function: { name: 'add' } },
      tools: [{ type: 'function', function: { ...addTool.function, parse: JSON.parse,
        function: ({ a, b }) => { ++called; return String(a + b); } } }] });
    await runner.done();
    equal(called, 1, 'calls of the function');
    const roles = runner.messages.map((m) => m.role);
    assert.ok(roles.includes('tool'), `the runner's messages ${show(roles)} have no tool result`);
  });
await check('openai: tool_choice required without tools throws BadRequestError', async () => {
  const error = await refused(toolClient.chat.completions.create({ model: toolModelId,
    messages: demoMessages, max_tokens: 8, tool_choice: 'required' }), BadRequestError, 400,
  'required without tools');
  equal(error.param, 'tool_choice', 'error.param');
});
const { tool } = await import('@langchain/core/tools');
const { HumanMessage, ToolMessage } = await import('@langchain/core/messages');
await check('langchain: bindTools (tool_choice required), then an agent step with the ' +
  'ToolMessage', async () => {
  const add = tool(({ a, b }) => String(a + b), { name: 'add', description: 'Adds two integers',
    schema: z.object({ a: z.number().int(), b: z.number().int() }) });
  const chat = new ChatOpenAI({ model: toolModelId, temperature: 0, maxTokens: 128, apiKey: 'none',
    maxRetries: 0, configuration: { baseURL: `${tools.url}/v1` } });
  const bound = chat.bindTools([add], { tool_choice: 'required' });
  const human = new HumanMessage(question(...DEMO));
  const ai = await bound.invoke([human]);
  assert.ok(ai.tool_calls?.length >= 1, `no tool_calls in ${show(ai)}`);
  const call = ai.tool_calls[0];
  equal(call.name, 'add', 'tool_calls[0].name');
  const args = AddArgs.safeParse(call.args);
  assert.ok(args.success, `tool_calls[0].args ${show(call.args)}: ${args.error?.message}`);
  const result = await add.invoke(call);  // a ToolMessage
  assert.ok(result instanceof ToolMessage, 'the tool answers a ToolMessage');
  const answer = await chat.invoke([human, ai, result]);
  assert.equal(typeof answer.content, 'string', 'the agent step answers text');
});

// SIGTERM drains and ends with exit 0.
for (const server of [main, overload, tools]) {
  await check(`kvvm serve (${server.name}) exits 0 on SIGTERM`, () => stopServer(server));
}

const seconds = ((Date.now() - started) / 1000).toFixed(1);
console.log(`# ${passed + failed} checks: ${passed} passed, ${failed} failed (${seconds} s)`);
process.exit(failed === 0 ? 0 : 1);
