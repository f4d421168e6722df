// An HTTP server on Node's own http module (test_body_after_answer.py),
// keep-alive as Node serves by default:
//
//     node tests/integration/early_node.js PORT
//
// PUT: 404 from the request's head, its body never read by the handler (a
// handler that rejects an upload): Node reads what is left of the body
// before the connection's next request, and with it whatever of that request
// has come. Anything else: 200, "hello\n".
const http = require('http');

http.createServer((req, res) => {
  const body = req.method === 'PUT' ? 'nope\n' : 'hello\n';
  res.writeHead(req.method === 'PUT' ? 404 : 200,
                {'Content-Type': 'text/plain', 'Content-Length': body.length});
  res.end(body);
}).listen(+process.argv[2], '127.0.0.1');
