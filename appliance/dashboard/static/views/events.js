// How each execution event looks: one row with its time, its kind and
// what it says; a tool's result goes under its call.

import { h } from '../dom.js';
import { usd, count, clock, duration, oneLine } from '../format.js';

const maxOutput = 20000; // characters of a tool's output shown

// renderEvent makes the row for one event.
export function renderEvent(ev) {
  const p = ev.payload || {};
  const [kind, body, level] = describe(ev.type, p);
  return h('div', { class: `event t-${ev.type}${level ? ' ' + level : ''}`, dataset: { seq: ev.seq, type: ev.type, toolId: ev.type === 'tool_call' ? p.id : undefined } },
    h('time', { datetime: ev.time, title: ev.time }, clock(ev.time)),
    h('span', { class: 'kind' }, kind),
    h('div', { class: 'body' }, body));
}

// attachResult puts a tool_result under the row of its call, if shown.
export function attachResult(events, ev) {
  const p = ev.payload || {};
  const call = p.id && events.querySelector(`[data-tool-id="${CSS.escape(p.id)}"] .body`);
  if (!call) return false;
  call.append(result(ev, p));
  return true;
}

function result(ev, p) {
  const out = String(p.output ?? '');
  const lines = out.replace(/\n$/, '').split('\n');
  const summary = (p.is_error ? 'error: ' : '') + oneLine(lines[0], 140) + (lines.length > 1 ? ` (+${lines.length - 1} lines)` : '');
  const shown = out.length > maxOutput ? out.slice(0, maxOutput) + `\n… ${count(out.length - maxOutput)} more characters` : out;
  return h('details', { class: `tool-result${p.is_error ? ' bad' : ''}`, dataset: ev ? { seq: ev.seq, type: ev.type } : {}, open: lines.length <= 12 },
    h('summary', {}, ev ? [h('time', { datetime: ev.time, title: ev.time }, clock(ev.time)), ' result: '] : null, summary),
    h('pre', {}, shown));
}

// describe is an event's label, body and level (warn, bad or none).
function describe(type, p) {
  switch (type) {
    case 'status':
      return ['status', status(p), p.error && p.error !== p.status ? 'bad' : ''];
    case 'text':
      return ['text', h('div', { class: 'text' }, p.text)];
    case 'tool_call':
      return ['tool', [h('strong', { class: 'tool-name' }, p.name), toolInput(p.input)]];
    case 'tool_result':
      return ['result', result(null, p), p.is_error ? 'bad' : ''];
    case 'file':
      return ['file', `${p.op} ${p.path}`];
    case 'model_call':
      return ['model', modelCall(p), p.status && p.status !== 200 ? 'bad' : ''];
    case 'budget':
      return ['budget', budget(p), p.level === 'exceeded' ? 'bad' : 'warn'];
    case 'error':
      return ['error', p.message || JSON.stringify(p), 'bad'];
    case 'network':
      return ['network', `${p.method || ''} ${p.host}${p.port ? ':' + p.port : ''}: ${p.allowed ? 'allowed' : 'refused'}${p.reason ? ' (' + p.reason + ')' : ''}`, p.allowed ? '' : 'warn'];
    case 'output':
      return [p.stream || 'output', h('span', { class: 'line' }, p.line)];
    case 'retry':
      return ['retry', retry(p), 'warn'];
    case 'warning':
      return ['warning', p.message || JSON.stringify(p), 'warn'];
    case 'system':
      return ['system', [h('strong', {}, p.subtype || ''), ' ', h('code', {}, p.truncated ? (p.snippet || '') + '…' : JSON.stringify(p.payload ?? {}))]];
    case 'child':
      return ['child', [h('a', { href: `#/execution/${encodeURIComponent(p.execution || '')}` }, p.execution), ` (${p.agent}) `,
        p.status === 'pending' ? 'started' : `${String(p.status).replace('_', ' ')}, ${usd(p.usd)}${p.error ? ': ' + p.error : ''}`],
      p.status === 'pending' || p.status === 'completed' ? '' : 'warn'];
    case 'claim':
      return ['claim', claim(p), p.op === 'taken_over' ? 'warn' : ''];
    case 'rewind':
      return ['rewind', rewind(p), 'warn'];
  }
  return [type, h('code', {}, JSON.stringify(p))];
}

function status(p) {
  switch (p.status) {
    case 'running':
      return `running agent ${p.agent ?? ''} with ${p.model ?? ''}`;
    case 'agent_started':
      return `the agent started (${p.model ?? ''}${p.claude_code_version ? ', claude code ' + p.claude_code_version : ''})`;
    case 'agent_finished':
      // num_turns is the CLI's own count, not the model calls the limit counts.
      return `the agent finished: ${p.outcome ?? ''} (CLI turns: ${p.num_turns ?? 0})`;
  }
  return p.error && p.error !== p.status ? `${p.status}: ${p.error}` : p.status;
}

// toolInput shows a command or a path as code, anything else as JSON.
function toolInput(input) {
  if (input && typeof input === 'object') {
    for (const k of ['command', 'file_path', 'path', 'pattern', 'url', 'query']) {
      if (typeof input[k] === 'string') {
        const rest = Object.keys(input).filter((x) => x !== k && x !== 'description');
        return [h('pre', { class: 'tool-input' }, input[k]),
          rest.length ? h('details', { class: 'tool-args' }, h('summary', {}, 'input'), h('pre', {}, JSON.stringify(input, null, 2))) : null];
      }
    }
  }
  return h('pre', { class: 'tool-input' }, JSON.stringify(input, null, 2));
}

function modelCall(p) {
  if (p.phase === 'start') return `${p.model}: call started (at most ${usd(p.max_usd)})`;
  let s = `${p.model}: ${count(p.input_tokens)} in / ${count(p.output_tokens)} out tokens`;
  if (p.cache_read_tokens || p.cache_creation_tokens) s += ` (cache ${count(p.cache_read_tokens)} read, ${count(p.cache_creation_tokens)} written)`;
  s += `, ${usd(p.usd)}`;
  if (p.latency_ms !== undefined) s += `, ${p.latency_ms < 1000 ? p.latency_ms + 'ms' : duration(p.latency_ms)}`;
  if (p.status && p.status !== 200) s += ` (HTTP ${p.status}: ${oneLine(p.error, 120)})`;
  if (p.cut) s += ' [cut]';
  return s;
}

// retry is the CLI's api_retry line: which attempt, after what, how long it waits.
function retry(p) {
  const why = p.status ? `HTTP ${p.status}${p.error ? ' ' + p.error : ''}` : p.error || 'no answer';
  const wait = (p.delay_ms ?? 0) < 1000 ? `${p.delay_ms ?? 0}ms` : duration(p.delay_ms);
  return `the CLI retries a model call (${oneLine(why, 120)}): attempt ${p.attempt ?? 0} of ${p.max_retries ?? 0} in ${wait}`;
}

// claim is a lease's event: "claimed s1/outputs/a.md until 15:04:05".
function claim(p) {
  let s = `${String(p.op || '').replace('_', ' ')} ${p.path}`;
  if (['claimed', 'renewed', 'taken_over'].includes(p.op) && p.expires) s += ` until ${clock(p.expires)}`;
  if (p.op === 'taken_over') s += ` by ${p.holder} (${p.previous}'s lease had expired)`;
  else if (p.by === 'operator') s += ' by an operator';
  else if (p.by === 'end') s += ' as the execution ended';
  return s;
}

// rewind is a rewind, its undo or a branch of the session.
function rewind(p) {
  const at = p.execution ? `after call ${p.session_call} (${p.execution} call ${p.call})` : `to snapshot ${p.snapshot}`;
  if (p.op === 'branched') return `session branched ${at} as ${p.branch}`;
  if (p.op === 'undone') return `rewind undone: back ${at}; the state before is snapshot ${p.undo}`;
  return `session rewound ${at}; the state before is snapshot ${p.undo}`;
}

function budget(p) {
  const money = p.limit === 'usd' || p.limit === 'credits';
  const amount = (x) => (money ? usd(x) : String(x));
  const limit = p.limit === 'turns' ? 'model calls' : p.limit; // the turns limit counts model calls
  if (p.level === 'exceeded') {
    return `${limit} limit reached (${amount(p.used)} of ${amount(p.max)}): model calls refused, the agent is stopped`;
  }
  if (p.level === 'topped_up') return `${limit} limit raised to ${amount(p.max)} (${amount(p.used)} spent)`;
  return `${limit} at ${amount(p.used)} of ${amount(p.max)}: the agent is told to wrap up`;
}
