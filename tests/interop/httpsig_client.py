"""A volley peer written apart from volley: Python `requests` for HTTP and
the `http-message-signatures` package (an RFC 9421 implementation that is
not ours) for signing, with RFC 9530 Content-Digest from that package too.

It joins with a token (signed by the key it registers), takes a task, downloads
the model, uploads a dense all-zero update for the task (202 expected), and
checks that the coordinator refuses a replayed request and a body changed after
signing. Prints one line per check and exits non-zero on the first failure.

    httpsig_client.py URL CA_PEM TOKEN
"""
import base64
import json
import secrets
import struct
import sys

import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from http_message_signatures import HTTPMessageSigner, HTTPSignatureKeyResolver, algorithms

URL, CA, TOKEN = sys.argv[1], sys.argv[2], sys.argv[3]
KEY = Ed25519PrivateKey.generate()
PK_B64 = base64.b64encode(KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


class Keys(HTTPSignatureKeyResolver):
    def resolve_private_key(self, key_id):
        return KEY

    def resolve_public_key(self, key_id):
        return KEY.public_key()


SIGNER = HTTPMessageSigner(signature_algorithm=algorithms.ED25519, key_resolver=Keys())
SESSION = requests.Session()


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def prepare(method, path, keyid, body=None, ctype=None):
    headers = {"Content-Type": ctype} if ctype else {}
    req = requests.Request(method, URL + path, data=body, headers=headers).prepare()
    if body is None:
        covered = ("@method", "@authority", "@target-uri")
        SIGNER.sign(req, key_id=keyid, nonce=secrets.token_urlsafe(24),
                    covered_component_ids=covered)
    else:
        # body= makes the package add Content-Digest and cover it.
        covered = ("@method", "@authority", "@target-uri", "content-length")
        SIGNER.sign(req, key_id=keyid, nonce=secrets.token_urlsafe(24),
                    covered_component_ids=covered, body=body)
    return req


def send(req):
    return SESSION.send(req, verify=CA, timeout=60)


def expect(what, resp, status, code=None):
    got = None
    if resp.status_code >= 400:
        try:
            got = resp.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            got = "(no JSON error)"
    if resp.status_code != status or (code is not None and got != code):
        fail(f"{what}: expected {status} {code or ''}, got {resp.status_code} {got or ''}: "
             f"{resp.text[:200]}")
    print(f"ok: {what}: {resp.status_code}{' ' + code if code else ''}")


body = json.dumps({"public_key": PK_B64, "token": TOKEN, "name": "interop"}).encode()
r = send(prepare("POST", "/v1/peers", PK_B64, body, "application/json"))
expect("join signed by the key it registers", r, 201)
peer = str(r.json()["peer_id"])

task_req = prepare("GET", "/v1/task?wait=20", peer)
r = send(task_req)
expect("task lease", r, 200)
task = r.json()

r = send(prepare("GET", "/v1/model", peer))
expect("model download", r, 200)
hlen = struct.unpack("<Q", r.content[:8])[0]
header = json.loads(r.content[8:8 + hlen])
n = 0
for name, t in header.items():
    if name == "__metadata__":
        continue
    size = 1
    for d in t["shape"]:
        size *= d
    n += size

# A download that broke off resumes with Range and If-Range on the
# version's ETag; a tag that no longer matches gets the whole file.
etag = r.headers.get("ETag", "")
whole = r.content
ranged = prepare("GET", "/v1/model", peer)
ranged.headers["Range"] = "bytes=100-"
ranged.headers["If-Range"] = etag
r = send(ranged)
expect("the rest of the model from byte 100 (If-Range on its ETag)", r, 206)
if r.content != whole[100:] or r.headers.get("Content-Range") != f"bytes 100-{len(whole) - 1}/{len(whole)}":
    fail(f"the ranged answer is not the file's tail: {r.headers.get('Content-Range')}, "
         f"{len(r.content)} bytes")
stale = prepare("GET", "/v1/model", peer)
stale.headers["Range"] = "bytes=100-"
stale.headers["If-Range"] = '"999999"'
r = send(stale)
expect("Range with an If-Range of another version: the whole file", r, 200)
if r.content != whole:
    fail("an If-Range that does not match did not get the whole file")
past = prepare("GET", "/v1/model", peer)
past.headers["Range"] = f"bytes={len(whole)}-"
past.headers["If-Range"] = etag
r = send(past)
expect("a range past the end of the model", r, 416, "bad_range")

r = send(task_req)
expect("the task request sent again as it was", r, 401, "replayed_nonce")

meta = {"run": task["run"], "task": str(task["task_id"]), "peer": peer,
        "base_version": str(task["base_version"]), "kind": "dense", "num_samples": "16",
        "local_steps": "1", "loss": "5.5"}
head = json.dumps({"__metadata__": meta,
                   "delta": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
head += b" " * (-len(head) % 8)
update = struct.pack("<Q", len(head)) + head + bytes(4 * n)

bad = prepare("POST", "/v1/updates", peer, update, "application/octet-stream")
bad.body = update[:-1] + b"\x01"  # same length, another body than the one signed
r = send(bad)
expect("an update changed after signing", r, 400, "digest_mismatch")

r = send(prepare("POST", "/v1/updates", peer, update, "application/octet-stream"))
expect("a dense update for the task", r, 202)
print("interop: 9 checks passed")
