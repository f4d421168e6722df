// A gateway on Node's own http module (test_calls.py): each request is
// passed to the upstream through a keep-alive agent, its answer back.
//
//     node tests/integration/gateway_node.js PORT UPSTREAM_PORT
const http = require('http');

const [port, upstream] = process.argv.slice(2).map(Number);
const agent = new http.Agent({keepAlive: true, maxSockets: 4});
http.createServer((req, res) => {
  const call = http.request({host: '127.0.0.1', port: upstream, path: req.url, agent}, (answer) => {
    const body = [];
    answer.on('data', (chunk) => body.push(chunk));
    answer.on('end', () => {
      res.writeHead(answer.statusCode, {'Content-Type': 'text/plain'});
      res.end(Buffer.concat(body));
    });
  });
  call.on('error', (e) => { res.writeHead(502); res.end(String(e)); });
  call.end();
}).listen(port, '127.0.0.1');
