// Recorded GenAI answers (tests/fixtures/genai) served by Node's own http
// module, which sends a response's head with its first write: a stream's head
// and first event go out in one write, and a client reads them in one read
// (test_genai_client.py). Node's framing, the recording's bytes.
//
//     node tests/integration/replay_node.js GAP_MS
//
// Prints "port N", then "ready". A POST to an OpenAI or Anthropic path
// (/v1/chat/completions, /v1/completions, /v1/messages) gets that path's
// fixture, streamed when its body says "stream": true, one event a write,
// GAP_MS apart; an OpenAI stream keeps its usage chunk only when asked
// (stream_options.include_usage), as genai_replay.py serves it.
const fs = require('fs');
const http = require('http');
const path = require('path');

const dir = path.join(__dirname, '..', 'fixtures', 'genai');
const index = JSON.parse(fs.readFileSync(path.join(dir, 'index.json')));
const gapMs = +process.argv[2] || 0;

function recorded(name) {
  const raw = fs.readFileSync(path.join(dir, `${name}.http`));
  const end = raw.indexOf('\r\n\r\n');
  const lines = raw.subarray(0, end).toString('latin1').split('\r\n');
  const headers = {};
  for (const line of lines.slice(1)) {
    const at = line.indexOf(':');
    headers[line.slice(0, at).trim().toLowerCase()] = line.slice(at + 1).trim();
  }
  let body = raw.subarray(end + 4);
  const writes = [];
  if ((headers['transfer-encoding'] || '').toLowerCase() === 'chunked') {
    for (let pos = 0; pos < body.length;) {
      const nl = body.indexOf('\r\n', pos);
      const size = parseInt(body.subarray(pos, nl).toString(), 16);
      if (!size) break;
      writes.push(body.subarray(nl + 2, nl + 2 + size));
      pos = nl + 2 + size + 2;
    }
  } else {
    writes.push(body);
  }
  return {status: +lines[0].split(' ')[1], type: headers['content-type'], writes};
}

function isUsageChunk(event) {  // an OpenAI stream's {"choices": [], "usage": ...}
  try {
    const obj = JSON.parse(event.toString().split('data:')[1]);
    return Array.isArray(obj.choices) && obj.choices.length === 0 && 'usage' in obj;
  } catch (e) {
    return false;
  }
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    let ask = {};
    try { ask = JSON.parse(Buffer.concat(chunks).toString() || '{}'); } catch (e) { ask = {}; }
    const stream = ask.stream === true;
    const name = Object.keys(index).find((n) => req.url.endsWith(index[n].path) && !index[n].error &&
                                                index[n].stream === stream);
    if (!name) {
      res.writeHead(404, {'Content-Type': 'application/json'});
      res.end(JSON.stringify({error: {message: `no fixture for ${req.url}`, type: 'NotFoundError'}}));
      return;
    }
    const r = recorded(name);
    const usage = (ask.stream_options || {}).include_usage === true;
    const events = r.writes.filter((e) => usage || !isUsageChunk(e));
    res.writeHead(r.status, {'Content-Type': r.type});  // sent with the first write
    const next = (i) => {
      if (i === events.length) return res.end();
      res.write(events[i]);
      setTimeout(() => next(i + 1), gapMs);
    };
    next(0);
  });
});
server.listen(0, '127.0.0.1', () => {
  console.log(`port ${server.address().port}`);
  console.log('ready');
});
