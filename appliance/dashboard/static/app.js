// The dashboard's entry point: a hash router over the views, the
// connection indicator and the sign-in banner.

import { onStatus, signIn, signOut, session } from './api.js';
import { h, replace } from './dom.js';
import * as executions from './views/executions.js';
import * as execution from './views/execution.js';
import * as schedules from './views/schedules.js';
import * as credits from './views/credits.js';
import * as sandboxes from './views/sandboxes.js';
import * as reference from './views/reference.js';
import * as start from './views/start.js';
import * as sessionView from './views/session.js';
import * as agents from './views/agents.js';
import * as workspace from './views/workspace.js';

// routes map "#/<first>/<rest>" to a view; each view's mount(el, arg)
// returns a function that stops its timers and streams.
const routes = {
  '': [executions, 'executions'],
  executions: [executions, 'executions'],
  execution: [execution, 'executions'],
  schedules: [schedules, 'schedules'],
  credits: [credits, 'credits'],
  sandboxes: [sandboxes, 'sandboxes'],
  api: [reference, 'api'],
  start: [start, 'start'],
  session: [sessionView, 'executions'],
  agents: [agents, 'agents'],
  workspace: [workspace, 'workspace'],
};

let unmount = () => {};

function route() {
  const [first, ...rest] = location.hash.replace(/^#\/?/, '').split('/');
  const [view, nav] = routes[first] || [];
  unmount();
  const el = document.getElementById('view');
  for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === nav);
  if (!view) {
    replace(el, h('p', { class: 'error' }, `No page ${location.hash}: `, h('a', { href: '#/' }, 'see the executions')));
    unmount = () => {};
    return;
  }
  replace(el);
  unmount = view.mount(el, decodeURIComponent(rest.join('/'))) || (() => {});
}

onStatus((ok, err) => {
  const conn = document.getElementById('conn');
  conn.className = ok ? 'conn ok' : 'conn down';
  conn.textContent = ok ? 'connected' : 'disconnected';
  const banner = document.getElementById('banner');
  if (err && err.status === 401) {
    replace(banner, h('strong', {}, 'Sign in needed. '),
      'On TCP every request needs the API token: open ', h('code', {}, `${location.origin}/ui/?token=TOKEN`),
      ' with the token from the daemon\'s token file (', h('code', {}, '<state_dir>/api.token'), ').');
    banner.hidden = false;
  } else if (ok) {
    banner.hidden = true;
  }
});

const out = document.getElementById('signout');
out.hidden = !session();
out.addEventListener('click', async () => {
  await signOut();
  out.hidden = true;
});

await signIn();
out.hidden = !session();
window.addEventListener('hashchange', route);
route();
