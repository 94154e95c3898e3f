import { Client } from '@hearth/sdk';

const c = new Client(); // $HEARTH_ADDR and $HEARTH_TOKEN when set, else the unix socket
const text = new TextDecoder();

// A sandbox: write a file, run a command with its output streamed, clean up.
const sbx = await c.sandboxes.create({ idle_timeout: '0' });
try {
  await c.sandboxes.writeFile(sbx.id, '/tmp/hello.txt', 'hello from the sandbox\n');
  for await (const frame of c.sandboxes.exec(sbx.id, ['sh', '-c', 'cat /tmp/hello.txt; echo warming up >&2'])) {
    if (frame.stream) console.log(frame.stream, text.decode(frame.data).trim());
    else if (frame.exit) console.log('exit', frame.exit.code);
  }
} finally {
  await c.sandboxes.destroy(sbx.id);
}

// An agent: delegate a task, follow it live, fetch what it wrote.
const run = await c.agents.run('analyst', 'Summarise inputs/notes.txt into outputs/report.md', {
  inputs: { 'notes.txt': 'first\nsecond\n' },
});
for await (const event of c.agents.events(run.id)) console.log(event.seq, event.type);
const done = await c.agents.get(run.id);
console.log(done.status, `$${done.usd.toFixed(4)}`);
console.log(text.decode(await c.agents.output(run.id, 'report.md')));
