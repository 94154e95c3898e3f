// The credit balance, the newest ledger entries, and spend over time
// drawn from the executions' metered cost.

import { get, query } from '../api.js';
import { h, replace, poll, errorBox } from '../dom.js';
import { usd, when } from '../format.js';

const svgNS = 'http://www.w3.org/2000/svg'; // the SVG namespace name, not a place anything is fetched from

export function mount(el) {
  const balance = h('div', { id: 'balance' });
  const chart = h('div', { id: 'spend-chart', class: 'chart' });
  const ledger = h('div', { id: 'ledger' });
  el.append(h('h1', {}, 'Credits'), balance, h('h2', {}, 'Spend over time'), chart, h('h2', {}, 'Ledger'), ledger);
  return poll(async () => {
    try {
      const [cr, execs] = await Promise.all([get('/v1/credits'), get('/v1/executions' + query({ limit: 1000 }))]);
      showBalance(balance, cr);
      showChart(chart, execs);
      showLedger(ledger, cr.entries || []);
    } catch (e) {
      replace(balance, errorBox(e));
    }
  }, 5000);
}

function showBalance(el, cr) {
  const card = (label, value, cls) => h('div', { class: `card ${cls || ''}` }, h('div', { class: 'muted small' }, label), h('div', { class: 'big' }, value));
  replace(el,
    h('div', { class: 'cards' },
      card('available', usd(cr.available), 'c-available'),
      card('reserved by running executions', usd(cr.reserved)),
      card('spent', usd(cr.spent), 'c-spent')),
    cr.enabled ? null : h('p', { class: 'muted' }, 'Credits are off (credits.enabled in the config): executions are held only by their own budgets. Spend is still metered.'));
}

function showLedger(el, entries) {
  if (entries.length === 0) {
    replace(el, h('p', { class: 'muted' }, 'No entries: add credits with ', h('code', {}, 'hearth credits add USD'), '.'));
    return;
  }
  replace(el, h('table', { class: 'list' },
    h('thead', {}, h('tr', {}, ['time', 'kind', 'amount', 'execution', 'note'].map((c) => h('th', {}, c)))),
    h('tbody', {}, entries.map((e) => h('tr', {},
      h('td', {}, when(e.time)),
      h('td', {}, e.kind),
      h('td', { class: 'num' }, usd(e.usd)),
      h('td', {}, e.execution ? h('a', { href: `#/execution/${encodeURIComponent(e.execution)}` }, e.execution) : ''),
      h('td', {}, e.note || ''))))));
}

// showChart draws the cumulative metered spend of the executions over
// the time they ended (or started, while they run).
function showChart(el, execs) {
  const points = execs
    .filter((e) => e.usd > 0)
    .map((e) => ({ t: Date.parse(e.ended || e.started || e.created), usd: e.usd }))
    .sort((a, b) => a.t - b.t);
  if (points.length === 0) {
    replace(el, h('p', { class: 'muted' }, 'Nothing spent yet.'));
    return;
  }
  let total = 0;
  for (const p of points) p.total = total += p.usd;
  const W = 640, H = 180, L = 64, R = 12, T = 12, B = 28;
  const t0 = points[0].t, t1 = Math.max(points[points.length - 1].t, t0 + 1);
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => H - B - (v / total) * (H - T - B);
  let d = `M ${x(t0)} ${y(0)}`;
  for (const p of points) d += ` H ${x(p.t).toFixed(1)} V ${y(p.total).toFixed(1)}`;
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `cumulative spend, ${usd(total)} in all` },
    svgEl('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' }),
    svgEl('line', { x1: L, y1: T, x2: L, y2: H - B, class: 'axis' }),
    svgEl('path', { d, class: 'spend' }),
    ...points.map((p) => svgEl('circle', { cx: x(p.t).toFixed(1), cy: y(p.total).toFixed(1), r: 2.5, class: 'dot' })),
    text(L - 6, T + 4, usd(total), 'end'),
    text(L - 6, H - B, '$0', 'end'),
    text(L, H - 8, when(new Date(t0)), 'start'),
    text(W - R, H - 8, when(new Date(t1)), 'end'));
  replace(el, svg, h('p', { class: 'muted small' }, `${usd(total)} metered over the ${points.length} newest executions that spent anything.`));
}

function svgEl(tag, attrs, ...children) {
  const el = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  el.append(...children);
  return el;
}

function text(x, y, s, anchor) {
  const t = svgEl('text', { x, y, 'text-anchor': anchor, class: 'label' });
  t.textContent = s;
  return t;
}
