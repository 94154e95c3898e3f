// A small helper to build DOM nodes: text is always set as text, never
// parsed as HTML, so what agents write cannot run in the page.

// h makes an element: h('a', {href: '#/', class: 'x'}, 'text', child...).
// Attributes starting with "on" are listeners; null children are skipped.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'style') Object.assign(el.style, v); // CSSOM: the page's policy forbids style attributes
    else if (k === 'dataset') {
      for (const [dk, dv] of Object.entries(v)) if (dv !== undefined && dv !== null) el.dataset[dk] = dv;
    }
    else el.setAttribute(k, v === true ? '' : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// replace puts children in place of el's.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

// badge is a status shown as a coloured label.
export const badge = (status) => h('span', { class: `badge s-${status}`, 'data-status': status }, status.replace('_', ' '));

// poll calls fn now and then every ms milliseconds after each call
// ends, until the returned stop is called.
export function poll(fn, ms) {
  let stopped = false;
  let timer;
  const loop = async () => {
    try {
      await fn();
    } catch (e) {
      console.warn(e);
    }
    if (!stopped) timer = setTimeout(loop, ms);
  };
  loop();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

// errorBox shows an API error where a view's content would be.
export const errorBox = (err) => h('p', { class: 'error' }, err.message);
