// An HTTPS server on Node's own https module (test_tls.py): Node carries
// OpenSSL in its executable, no libssl mapped.
//
//     node tests/integration/https_node.js PORT CERT KEY
//
// /json/NAME: 200 and a small JSON body; /status/CODE: that status; else 404.
const fs = require('fs');
const https = require('https');

const [port, cert, key] = process.argv.slice(2);
https.createServer({cert: fs.readFileSync(cert), key: fs.readFileSync(key)}, (req, res) => {
  const status = req.url.startsWith('/json/') ? 200
    : req.url.startsWith('/status/') ? +req.url.slice(8) || 400 : 404;
  const body = status === 200 ? JSON.stringify({path: req.url}) : `${status}\n`;
  res.writeHead(status, {'Content-Type': status === 200 ? 'application/json' : 'text/plain',
                         'Content-Length': Buffer.byteLength(body)});
  res.end(body);
}).listen(+port, '127.0.0.1');
