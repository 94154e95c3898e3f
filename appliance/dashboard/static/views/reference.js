// The API reference: the operations of the daemon's own OpenAPI document
// (GET /openapi.json, the same as /openapi.yaml), by tag, each with its
// parameters, request body and answers. Nothing is fetched from elsewhere.

import { get } from '../api.js';
import { h, replace, errorBox } from '../dom.js';

const methods = ['get', 'put', 'post', 'delete', 'patch'];

export function mount(el) {
  const body = h('div', { id: 'reference' }, h('p', { class: 'muted' }, 'Loading…'));
  el.append(h('h1', {}, 'API reference'), body);
  let live = true;
  get('/openapi.json').then((doc) => live && show(body, doc), (e) => live && replace(body, errorBox(e)));
  return () => { live = false; };
}

// ref names a schema: "#/components/schemas/Sandbox" is "Sandbox".
const ref = (s) => (s && s.$ref ? s.$ref.split('/').pop() : s && s.type === 'array' && s.items ? `${ref(s.items)}[]` : (s && s.type) || '');

function resolve(doc, p) {
  if (!p || !p.$ref) return p;
  return p.$ref.split('/').slice(1).reduce((o, k) => (o ? o[k] : undefined), doc);
}

function show(el, doc) {
  const groups = new Map();
  for (const [path, item] of Object.entries(doc.paths || {})) {
    for (const m of methods) {
      const op = item[m];
      if (!op) continue;
      const tag = (op.tags && op.tags[0]) || 'other';
      if (!groups.has(tag)) groups.set(tag, []);
      groups.get(tag).push({ path, method: m, op, params: [...(item.parameters || []), ...(op.parameters || [])].map((p) => resolve(doc, p)) });
    }
  }
  const count = [...groups.values()].reduce((n, ops) => n + ops.length, 0);
  replace(el,
    h('p', { class: 'muted' }, `${doc.info.title}, version ${doc.info.version}: ${count} operations. The document itself: `,
      h('a', { href: '/openapi.yaml' }, '/openapi.yaml'), ' (or ', h('a', { href: '/openapi.json' }, '/openapi.json'),
      '), to generate a client in any language; the Python and TypeScript SDKs are in the repository\'s sdk/.'),
    h('p', { class: 'muted small' }, ...[...groups.keys()].flatMap((tag, i) => [i ? ' · ' : '', h('a', { href: `#/api/${tag}` }, tag)])),
    [...groups].map(([tag, ops]) => h('section', { id: `api-${tag}` },
      h('h2', {}, tag),
      ops.map((o) => operation(doc, o)))));
  const want = decodeURIComponent(location.hash.split('/')[2] || '');
  if (want) document.getElementById(`api-${want}`)?.scrollIntoView();
}

function operation(doc, { path, method, op, params }) {
  const body = op.requestBody && op.requestBody.content;
  return h('details', { class: 'op', dataset: { op: op.operationId } },
    h('summary', {},
      h('code', { class: `method m-${method}` }, method.toUpperCase()), ' ',
      h('code', { class: 'path' }, path), ' ',
      h('span', { class: 'muted' }, op.summary || '')),
    h('p', { class: 'small muted' }, 'operationId ', h('code', {}, op.operationId)),
    (op.description || '').split(/\n\s*\n/).filter((p) => p.trim()).map((p) => h('p', { class: 'desc' }, p.replace(/\s*\n\s*/g, ' '))),
    params.length ? h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['parameter', 'in', 'type', ''].map((c) => h('th', {}, c)))),
      h('tbody', {}, params.map((p) => h('tr', {},
        h('td', {}, h('code', {}, p.name), p.required ? ' *' : ''),
        h('td', {}, p.in),
        h('td', {}, ref(p.schema)),
        h('td', { class: 'small' }, p.description || ''))))) : null,
    body ? h('p', {}, 'Body: ', Object.entries(body).map(([type, c], i) => [i ? ', ' : '', h('code', {}, type), ' ', ref(c.schema)])) : null,
    h('p', {}, 'Answers: ', Object.entries(op.responses || {}).map(([code, r], i) => {
      const res = resolve(doc, r);
      const types = Object.entries((res && res.content) || {}).map(([type, c]) => `${type} ${ref(c.schema)}`.trim());
      return [i ? '; ' : '', h('code', {}, code), ' ', types.join(', ') || (res && res.description) || ''];
    })));
}
