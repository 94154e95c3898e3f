// "#/agents": the agent definitions (CLI, image, model, limits), their
// schedules, and what each spent lately, with a button to start a task.

import { get, query } from '../api.js';
import { h, replace, poll, errorBox } from '../dom.js';
import { usd, when } from '../format.js';

// recent is how far back "recent spend" looks, and how many executions
// it reads at most.
const recent = { ms: 24 * 3600 * 1000, limit: 1000 };

export function mount(el) {
  const body = h('div', { id: 'agents' });
  el.append(h('div', { class: 'head' }, h('h1', {}, 'Agents'), h('a', { class: 'button', href: '#/start' }, 'Start a task')), body);
  return poll(async () => {
    try {
      const [agents, schedules, execs] = await Promise.all([get('/v1/agents'), get('/v1/schedules'), get(`/v1/executions${query({ limit: recent.limit })}`)]);
      show(body, agents, schedules, spendByAgent(execs));
    } catch (e) {
      replace(body, errorBox(e));
    }
  }, 5000);
}

// limitsText says an agent's limits for people.
export function limitsText(l = {}) {
  const parts = [l.usd ? `${usd(l.usd)}` : 'no dollar limit', l.turns ? `${l.turns} model calls` : null,
    l.wall_time ? `${l.wall_time} wall time` : null, l.on_budget ? `${l.on_budget} at the limit` : null];
  return parts.filter(Boolean).join(', ');
}

// spendByAgent sums what each agent's executions of the last day spent.
function spendByAgent(execs, now = Date.now()) {
  const out = {};
  for (const e of execs) {
    if (now - new Date(e.created).getTime() > recent.ms) continue;
    const s = (out[e.agent] ||= { usd: 0, runs: 0 });
    s.usd += e.usd || 0;
    s.runs++;
  }
  return out;
}

function show(el, agents, schedules, spend) {
  if (agents.length === 0) {
    replace(el, h('p', { class: 'muted empty' }, 'No agents are defined: add a definition under the agents directory, then ', h('code', {}, 'hearth agents reload'), '.'));
    return;
  }
  replace(el, h('table', { class: 'list' },
    h('thead', {}, h('tr', {}, ['agent', 'runs on', 'limits', 'schedules', 'last 24 h', ''].map((c) => h('th', {}, c)))),
    h('tbody', {}, agents.map((a) => row(a, schedules.filter((s) => s.agent === a.name), spend[a.name] || { usd: 0, runs: 0 })))));
}

function row(a, schedules, spent) {
  return h('tr', { dataset: { agent: a.name } },
    h('td', {}, h('strong', {}, a.name), h('div', { class: 'muted small' }, a.description || '')),
    h('td', { class: 'c-runs' }, h('div', {}, `CLI ${a.cli || 'from its image'} · image `, h('code', {}, a.image)), h('div', { class: 'muted small' }, `model ${a.model}`)),
    h('td', { class: 'c-limits' }, limitsText(a.limits)),
    h('td', { class: 'c-schedules' }, schedules.length === 0 ? h('span', { class: 'muted' }, 'none')
      : schedules.map((s) => h('div', {}, h('a', { href: `#/schedules/${encodeURIComponent(s.id)}` }, h('code', {}, s.spec)),
        s.next ? h('span', { class: 'muted small' }, ` next ${when(s.next)}`) : null))),
    h('td', { class: 'c-spent num' }, `${usd(spent.usd)} in ${spent.runs} run${spent.runs === 1 ? '' : 's'}`),
    h('td', {}, h('a', { class: 'start', href: `#/start/${encodeURIComponent(a.name)}` }, 'start a task')));
}
