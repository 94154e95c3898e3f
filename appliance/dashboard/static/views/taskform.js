// The form that starts a task or resumes a session: a prompt, input
// files uploaded from the browser, and a budget in dollars that can only
// tighten the agent's own limit (the API refuses a looser one).

import { postTask } from '../api.js';
import { h, errorBox } from '../dom.js';
import { usd } from '../format.js';

// taskForm builds the form. path is where it posts; request(prompt, usd)
// makes the JSON request; limit() is the agent's dollar limit (0: none).
// On success the page goes to the new execution's stream.
export function taskForm({ id, path, request, limit, label }) {
  const prompt = h('textarea', { name: 'prompt', rows: 5, required: true, placeholder: 'What should the agent do?' });
  const files = h('input', { type: 'file', name: 'inputs', multiple: true });
  const budget = h('input', { type: 'number', name: 'budget', min: '0', step: '0.01', placeholder: 'the agent\'s limit' });
  const hint = h('span', { class: 'muted small budget-hint' });
  const status = h('div', { class: 'form-status' });
  const button = h('button', { type: 'submit' }, label);
  const showLimit = () => {
    const l = limit();
    hint.textContent = l ? `at most the agent's limit, ${usd(l)}` : 'the agent has no dollar limit';
  };
  const form = h('form', { id, class: 'task-form', onsubmit: (e) => submit(e) },
    h('label', {}, 'Prompt', prompt),
    h('label', {}, 'Input files ', h('span', { class: 'muted small' }, '(put in the session\'s inputs/)'), files),
    h('label', {}, 'Budget, dollars ', budget, ' ', hint),
    h('div', { class: 'actions' }, button), status);
  async function submit(e) {
    e.preventDefault();
    button.disabled = true;
    status.replaceChildren(h('span', { class: 'muted' }, 'Starting…'));
    try {
      const dollars = budget.value === '' ? 0 : Number(budget.value);
      const exec = await postTask(path(), request(prompt.value, dollars), [...files.files]);
      location.hash = `#/execution/${encodeURIComponent(exec.id)}`;
    } catch (err) {
      status.replaceChildren(errorBox(err));
    } finally {
      button.disabled = false;
    }
  }
  form.showLimit = showLimit;
  showLimit();
  return form;
}

// limitsFor is the limits a request sends for a budget: a dollar figure
// tightens the agent's; none keeps it.
export const limitsFor = (dollars) => (dollars > 0 ? { usd: dollars } : undefined);
