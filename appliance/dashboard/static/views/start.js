// "#/start" (or "#/start/AGENT"): start a task. Pick an agent, see its
// limits, write the prompt, upload inputs, set a budget; then the page
// follows the new execution's stream.

import { get } from '../api.js';
import { h, replace, errorBox } from '../dom.js';
import { taskForm, limitsFor } from './taskform.js';
import { limitsText } from './agents.js';

export function mount(el, preset) {
  el.append(h('h1', {}, 'Start a task'));
  load(el, preset);
}

async function load(el, preset) {
  let agents;
  try {
    agents = await get('/v1/agents');
  } catch (e) {
    el.append(errorBox(e));
    return;
  }
  if (agents.length === 0) {
    el.append(h('p', { class: 'muted empty' }, 'No agents are defined: add a definition under the agents directory, then ', h('code', {}, 'hearth agents reload'), '.'));
    return;
  }
  const select = h('select', { name: 'agent', id: 'agent' }, agents.map((a) => h('option', { value: a.name, selected: a.name === preset }, a.name)));
  const about = h('div', { class: 'muted small', id: 'agent-about' });
  const chosen = () => agents.find((a) => a.name === select.value);
  const form = taskForm({
    id: 'start-form', label: 'Start',
    path: () => '/v1/executions',
    request: (prompt, dollars) => ({ agent: select.value, prompt, limits: limitsFor(dollars) }),
    limit: () => chosen().limits.usd || 0,
  });
  const describe = () => {
    const a = chosen();
    replace(about, a.description || '', h('div', {}, `CLI ${a.cli || 'from its image'}, image ${a.image}, model ${a.model}; limits: ${limitsText(a.limits)}`));
    form.showLimit();
  };
  select.addEventListener('change', describe);
  form.prepend(h('label', {}, 'Agent', select, about));
  el.append(form);
  describe();
}
