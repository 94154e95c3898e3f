// Numbers, times and money for people, as the hearth CLI writes them.

// usd is "$1,234.50"; under a dollar up to four decimals ("$0.0045"),
// since one model call costs a fraction of a cent.
export function usd(v) {
  v = v || 0;
  if (Math.abs(v) >= 1 || v === 0) {
    return '$' + v.toLocaleString('en-US', { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  }
  let s = v.toFixed(4);
  while (s.endsWith('0') && s.length - s.indexOf('.') > 3) s = s.slice(0, -1);
  return '$' + s;
}

// duration is "0.8s", "42s", "3m 42s", "1h 05m".
export function duration(ms) {
  const s = Math.max(0, ms) / 1000;
  if (s < 10) return `${s.toFixed(1)}s`;
  if (s < 60) return `${Math.floor(s)}s`;
  const pad = (n) => String(n).padStart(2, '0');
  if (s < 3600) return `${Math.floor(s / 60)}m ${pad(Math.floor(s) % 60)}s`;
  return `${Math.floor(s / 3600)}h ${pad(Math.floor(s / 60) % 60)}m`;
}

// turnsOf is the model calls made: "call 12/50", or "call 12" without a
// limit (limits.turns, which counts model calls).
export function turnsOf(e) {
  const max = e.limits && e.limits.turns;
  return max ? `call ${e.turns}/${max}` : `call ${e.turns}`;
}

// spendOf is "$1.24 of $10.00", or "$1.24" without a budget.
export function spendOf(e) {
  const max = e.limits && e.limits.usd;
  return max ? `${usd(e.usd)} of ${usd(max)}` : usd(e.usd);
}

// ranFor is how long the execution has run (so far).
export function ranFor(e, now = Date.now()) {
  if (!e.started) return 'not started';
  const end = e.ended ? Date.parse(e.ended) : now;
  return duration(end - Date.parse(e.started));
}

// ended are the statuses of an execution that has ended; status events
// also report steps on the way ("agent_started"), which are not.
const ended = new Set(['completed', 'failed', 'budget_exceeded', 'timed_out', 'cancelled', 'interrupted']);
export const terminal = (status) => ended.has(status);

// bytes is "1.2 MB" (SI, as go-humanize writes it).
export function bytes(n) {
  if (n === undefined || n === null || n < 0) return '?';
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) {
    n /= 1000;
    i++;
  }
  return i === 0 ? `${n} B` : `${n < 10 ? n.toFixed(1) : Math.round(n)} ${units[i]}`;
}

export const count = (n) => (n || 0).toLocaleString('en-US');

// clock is the time of day with milliseconds, for event stamps.
export function clock(t) {
  const d = new Date(t);
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

// when is a date and time, "2026-11-22 01:52:51".
export function when(t) {
  if (!t) return '';
  const d = new Date(t);
  const pad = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// relative is "in 3m 20s" or "5m 02s ago".
export function relative(t, now = Date.now()) {
  if (!t) return '';
  const d = Date.parse(t) - now;
  return d >= 0 ? `in ${duration(d)}` : `${duration(-d)} ago`;
}

// oneLine shortens text to one line of at most max characters.
export function oneLine(s, max = 200) {
  s = String(s ?? '').replace(/\s+/g, ' ').trim();
  return s.length > max ? s.slice(0, max - 1) + '…' : s;
}

// goDuration reads a Go duration ("1m2.5s", "8.603382ms") as
// milliseconds; NaN if it is not one.
export function goDuration(s) {
  const unit = { h: 3600e3, m: 60e3, s: 1e3, ms: 1, us: 1e-3, 'µs': 1e-3, 'μs': 1e-3, ns: 1e-6 };
  s = String(s);
  if (s === '0') return 0;
  const sign = s.startsWith('-') ? -1 : 1;
  const rest = s.replace(/^[-+]/, '');
  const re = /(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|μs|ns)/y; // sticky: each part starts where the last ended
  let ms = 0;
  let end = 0;
  for (let m; (m = re.exec(rest)); end = re.lastIndex) ms += parseFloat(m[1]) * unit[m[2]];
  return rest && end === rest.length ? sign * ms : NaN;
}
