/**
 * The spawner (spawner.ts) written in Python, used when the host has a python3 (3.9 or later, on
 * Linux 5.3 or later). Node's `spawn` forks its whole process (the node spawner's ~50 MB, its page
 * tables copied at every start) and sets up each child through libuv's machinery; Python's
 * `os.posix_spawn` is glibc's vfork-style clone, which copies nothing: measured on a 2-core AMD
 * EPYC, a `true` started from node costs its parent about 1.8 ms of CPU, from Python 0.15 ms.
 *
 * It speaks the node spawner's protocol over the same Node IPC channel, in its JSON form (one JSON
 * object per line, NODE_CHANNEL_FD), output as base64. It starts each program as libuv does for
 * `spawn(file, args, { cwd, env, detached: true, stdio: ["ignore", "pipe", "pipe"] })`, so a step
 * sees no difference: a new session (setsid), stdin /dev/null, stdout and stderr unix socket
 * pairs (libuv's pipes are socket pairs), every signal at its default and none blocked, the file
 * looked up on the PATH of the child's own environment (else /usr/bin:/bin), no other descriptor
 * inherited; and errors worded as node words them ("spawn <file> ENOENT"). When the program exits
 * its process group is killed and its output is read to the end, or given up on after 1 s, as the
 * node spawner does. It ignores SIGINT, SIGTERM and SIGHUP and exits when the worker's channel
 * closes.
 */
export const SPAWNER_PYTHON_SOURCE = String.raw`# rollgate sandbox spawner (generated; see spawner-python.ts)
import base64, errno, json, os, selectors, signal, socket, sys, time

chan = socket.socket(fileno=int(os.environ.pop("NODE_CHANNEL_FD")))
chan.set_inheritable(False)
os.environ.pop("NODE_CHANNEL_SERIALIZATION_MODE", None)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
# What the child gets reset to default: every signal (ours ignore some, and SIG_IGN survives exec).
SIGDEF = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
sel = selectors.DefaultSelector()
steps = {}

def send(m):
    try:
        chan.sendall((json.dumps(m, separators=(",", ":")) + "\n").encode())
    except OSError:
        sys.exit(0)  # the worker is gone

def code_of(e):
    return errno.errorcode.get(e.errno, "UNKNOWN") if e.errno else "UNKNOWN"

def spawn_one(file, argv, env, actions):
    # libuv's uv__execvpe: a name without a slash is looked up on the child's PATH; EACCES is
    # remembered while the search goes on, ENOENT and ENOTDIR skip to the next folder.
    if "/" in file:
        return os.posix_spawn(file, argv, env, file_actions=actions, setsid=True, setsigdef=SIGDEF, setsigmask=[])
    err = None
    for d in env.get("PATH", "/usr/bin:/bin").split(":"):
        path = os.path.join(d or ".", file)
        try:
            # A stat is a few microseconds, a failed posix_spawn a clone and an execve.
            os.stat(path)
            return os.posix_spawn(path, argv, env, file_actions=actions, setsid=True, setsigdef=SIGDEF, setsigmask=[])
        except OSError as e:
            if e.errno == errno.EACCES:
                err = e
            elif e.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise
    raise err or OSError(errno.ENOENT, "not found")

class Step:
    def __init__(self, req):
        self.id = req["id"]
        argv = req["argv"]
        self.pid = None
        self.status = None
        self.open = 0
        self.deadline = None
        out = err = None
        try:
            out = socket.socketpair()
            err = socket.socketpair()
            os.chdir(req["cwd"])
            actions = [
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out[1].fileno(), 1),
                (os.POSIX_SPAWN_DUP2, err[1].fileno(), 2),
            ]
            self.pid = spawn_one(argv[0], argv, req["env"], actions)
        except (OSError, ValueError, TypeError) as e:
            for p in (out, err):
                if p:
                    p[0].close()
                    p[1].close()
            msg = ("spawn %s %s" % (argv[0], code_of(e))) if isinstance(e, OSError) else str(e)
            send({"op": "error", "id": self.id, "message": msg})
            return
        out[1].close()
        err[1].close()
        send({"op": "spawned", "id": self.id, "pid": self.pid})
        self.pidfd = os.pidfd_open(self.pid)
        sel.register(self.pidfd, selectors.EVENT_READ, (self, "exit"))
        for fd, s in ((1, out[0]), (2, err[0])):
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, (self, fd))
            self.open += 1
        steps[self.id] = self

    def on_output(self, fd, s):
        # Read what the socket holds (up to 32 reads, as libuv does) before looking at the other
        # stream: the output keeps the order the program wrote it in (stderr's backlog, then the
        # stdout line printed after it), which one read per wake-up would interleave.
        got = []
        ended = False
        for _ in range(32):
            try:
                b = s.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                b = b""
            if not b:
                ended = True
                break
            got.append(b)
        if got:
            send({"op": "out", "id": self.id, "fd": fd, "b64": base64.b64encode(b"".join(got)).decode("ascii")})
        if not ended:
            return
        sel.unregister(s)
        s.close()
        self.open -= 1
        self.maybe_done()

    def on_exit(self):
        sel.unregister(self.pidfd)
        os.close(self.pidfd)
        _, st = os.waitpid(self.pid, 0)
        self.status = st
        # Whatever the program left running in its group goes with it, and its output is waited
        # for at most 1 s (an escaped grandchild may hold the pipes open).
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.deadline = time.monotonic() + 1.0
        self.maybe_done()

    def give_up(self):
        for key in list(sel.get_map().values()):
            if key.data[0] is self and key.data[1] != "exit":
                sel.unregister(key.fileobj)
                key.fileobj.close()
        self.open = 0
        self.maybe_done()

    def maybe_done(self):
        if self.status is None or self.open > 0:
            return
        del steps[self.id]
        st = self.status
        if os.WIFSIGNALED(st):
            n = os.WTERMSIG(st)
            try:
                name = signal.Signals(n).name
            except ValueError:
                name = "SIG%d" % n
            send({"op": "exit", "id": self.id, "code": None, "signal": name})
        else:
            send({"op": "exit", "id": self.id, "code": os.WEXITSTATUS(st), "signal": None})

buf = b""
def on_channel():
    global buf
    try:
        b = chan.recv(65536)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        b = b""
    if not b:
        sys.exit(0)
    buf += b
    while True:
        i = buf.find(b"\n")
        if i < 0:
            break
        line, buf = buf[:i], buf[i + 1:]
        req = json.loads(line)
        if isinstance(req, dict) and req.get("op") == "spawn":
            Step(req)

chan.setblocking(True)
sel.register(chan, selectors.EVENT_READ, (None, "chan"))
send({"op": "ready"})
while True:
    now = time.monotonic()
    timeout = None
    for st in steps.values():
        if st.deadline is not None:
            left = max(0.0, st.deadline - now)
            timeout = left if timeout is None else min(timeout, left)
    for key, _ in sel.select(timeout):
        step, what = key.data
        if what == "chan":
            on_channel()
        elif step.id not in steps:
            continue
        elif what == "exit":
            step.on_exit()
        else:
            step.on_output(what, key.fileobj)
    now = time.monotonic()
    for st in list(steps.values()):
        if st.deadline is not None and st.deadline <= now:
            st.give_up()
`;
