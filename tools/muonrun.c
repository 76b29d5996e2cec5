/* muonrun - start N local ranks of a muon program, torchrun-style, without Python.

   usage: muonrun -n N [--store DIR] [--timeout S] [--grace S] [--] prog [args...]

   - Makes a fresh rendezvous directory for Gloo's FileStore (it refuses keys of an earlier run):
     mkdtemp("$TMPDIR/muon-XXXXXX") (or /tmp), or a fresh muon-XXXXXX subdirectory inside
     --store DIR, and removes it at the end.
   - Starts N children with MUON_RANK, MUON_WORLD_SIZE, MUON_STORE, and also RANK, WORLD_SIZE,
     LOCAL_RANK, LOCAL_WORLD_SIZE, in the environment. All children are forked before any of them
     creates a Gloo device (Gloo's threads do not survive a fork).
   - Forwards each child's stdout and stderr, line by line, to its own stdout and stderr with a
     "[rank] " prefix; a last line without a newline is flushed when the child closes the stream.
   - When a child exits non-zero or is killed by a signal, the others get SIGTERM, and SIGKILL
     after the grace period (default 3 s). Only muonrun's own children are ever signalled.
   - Exit status: 0 if every rank exited 0; else the first failure's status (128 + signal number
     for a signal); 124 when --timeout S expired (everything is stopped as above); 2 for a usage
     error, 1 when muonrun itself cannot set up (fork, pipe, directory).
   - SIGINT / SIGTERM / SIGHUP to muonrun stop the children the same way (status 128 + signal).

   Build: cc -std=c99 -Wall -Wextra -Wpedantic -D_POSIX_C_SOURCE=200809L tools/muonrun.c -o muonrun
*/
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#define MUONRUN_MAX_RANKS 1024
#define MUONRUN_LINE_MAX 65536 /* a longer line is forwarded in pieces */

typedef struct stream {
  int fd;      /* read end, -1 once closed */
  int out_fd;  /* 1 or 2 */
  char *buf;
  size_t len;
} stream;

typedef struct child {
  pid_t pid;   /* 0 once reaped */
  int status;  /* exit code, or 128 + signal */
  stream s[2]; /* stdout, stderr */
} child;

static volatile sig_atomic_t muonrun_signal;

static void on_signal(int sig) { muonrun_signal = sig; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(void) {
  fprintf(stderr,
          "usage: muonrun -n N [--store DIR] [--timeout S] [--grace S] [--] prog [args...]\n"
          "  -n N         number of ranks (1..%d)\n"
          "  --store DIR  make the fresh rendezvous directory inside DIR (default $TMPDIR or /tmp)\n"
          "  --timeout S  stop everything after S seconds and exit 124\n"
          "  --grace S    seconds between SIGTERM and SIGKILL when stopping (default 3)\n",
          MUONRUN_MAX_RANKS);
}

/* write() all of it; output errors (a closed terminal or pipe) are ignored: the ranks go on. */
static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += w;
    n -= (size_t)w;
  }
}

/* One forwarded line: "[rank] " + text + "\n", in one write so lines of ranks do not mix. */
static void emit_line(int out_fd, int rank, const char *text, size_t n) {
  char prefix[32];
  int plen = snprintf(prefix, sizeof prefix, "[%d] ", rank);
  char *line = (char *)malloc((size_t)plen + n + 1);
  if (!line) {
    write_all(out_fd, prefix, (size_t)plen);
    write_all(out_fd, text, n);
    write_all(out_fd, "\n", 1);
    return;
  }
  memcpy(line, prefix, (size_t)plen);
  memcpy(line + plen, text, n);
  line[(size_t)plen + n] = '\n';
  write_all(out_fd, line, (size_t)plen + n + 1);
  free(line);
}

/* Reads what is there; forwards every complete line; at EOF flushes the rest and closes. */
static void pump(stream *s, int rank) {
  char tmp[8192];
  ssize_t r = read(s->fd, tmp, sizeof tmp);
  if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (r <= 0) {
    if (s->len) emit_line(s->out_fd, rank, s->buf, s->len);
    s->len = 0;
    close(s->fd);
    s->fd = -1;
    return;
  }
  size_t i;
  for (i = 0; i < (size_t)r; i++) {
    if (tmp[i] == '\n') {
      emit_line(s->out_fd, rank, s->buf, s->len);
      s->len = 0;
    } else {
      if (s->len == MUONRUN_LINE_MAX) {
        emit_line(s->out_fd, rank, s->buf, s->len);
        s->len = 0;
      }
      s->buf[s->len++] = tmp[i];
    }
  }
}

/* Removes the files directly inside dir (FileStore keeps its keys flat), then dir. */
static void remove_store(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      char path[PATH_MAX];
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path) unlink(path);
    }
    closedir(d);
  }
  if (rmdir(dir) != 0)
    fprintf(stderr, "muonrun: cannot remove the store directory %s: %s\n", dir, strerror(errno));
}

static int parse_seconds(const char *s, double *out) {
  char *end;
  double v;
  errno = 0;
  v = strtod(s, &end);
  if (errno || end == s || *end || !(v > 0) || v > 1e9) return 0;
  *out = v;
  return 1;
}

static void signal_all(child *c, int n, int sig) {
  int i;
  for (i = 0; i < n; i++)
    if (c[i].pid > 0) kill(c[i].pid, sig);
}

int main(int argc, char **argv) {
  pid_t parent = getpid();
  int n = 0, argi = 1, i;
  const char *store_parent = NULL;
  double timeout = 0, grace = 3;
  char store[PATH_MAX];
  child *ch;
  struct sigaction sa;

  while (argi < argc && argv[argi][0] == '-') {
    const char *a = argv[argi];
    if (!strcmp(a, "--")) {
      argi++;
      break;
    }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage();
      return 0;
    }
    if (argi + 1 >= argc) {
      fprintf(stderr, "muonrun: %s needs a value\n", a);
      usage();
      return 2;
    }
    if (!strcmp(a, "-n") || !strcmp(a, "--nproc")) {
      char *end;
      long v = strtol(argv[argi + 1], &end, 10);
      if (*end || end == argv[argi + 1] || v < 1 || v > MUONRUN_MAX_RANKS) {
        fprintf(stderr, "muonrun: -n wants 1..%d ranks, got '%s'\n", MUONRUN_MAX_RANKS,
                argv[argi + 1]);
        return 2;
      }
      n = (int)v;
    } else if (!strcmp(a, "--store")) {
      store_parent = argv[argi + 1];
    } else if (!strcmp(a, "--timeout")) {
      if (!parse_seconds(argv[argi + 1], &timeout)) {
        fprintf(stderr, "muonrun: --timeout wants seconds > 0, got '%s'\n", argv[argi + 1]);
        return 2;
      }
    } else if (!strcmp(a, "--grace")) {
      if (!parse_seconds(argv[argi + 1], &grace)) {
        fprintf(stderr, "muonrun: --grace wants seconds > 0, got '%s'\n", argv[argi + 1]);
        return 2;
      }
    } else {
      fprintf(stderr, "muonrun: unknown option %s\n", a);
      usage();
      return 2;
    }
    argi += 2;
  }
  if (n < 1 || argi >= argc) {
    fprintf(stderr, "muonrun: %s\n", n < 1 ? "-n N is required" : "no program given");
    usage();
    return 2;
  }

  /* A fresh store directory, ours to delete. */
  {
    const char *parent = store_parent;
    size_t plen;
    if (!parent) parent = getenv("TMPDIR");
    if (!parent || !*parent) parent = "/tmp";
    plen = strlen(parent);
    while (plen > 1 && parent[plen - 1] == '/') plen--;
    if (snprintf(store, sizeof store, "%.*s/muon-XXXXXX", (int)plen, parent) >= (int)sizeof store) {
      fprintf(stderr, "muonrun: store path too long\n");
      return 1;
    }
    if (!mkdtemp(store)) {
      fprintf(stderr, "muonrun: cannot create a store directory in %.*s: %s\n", (int)plen,
              parent, strerror(errno));
      return 1;
    }
    if (store[0] != '/') { /* children may chdir; give them an absolute path */
      char cwd[PATH_MAX], abs[PATH_MAX];
      if (getcwd(cwd, sizeof cwd) &&
          snprintf(abs, sizeof abs, "%s/%s", cwd, store) < (int)sizeof abs)
        strcpy(store, abs);
    }
  }

  ch = (child *)calloc((size_t)n, sizeof *ch);
  if (!ch) {
    fprintf(stderr, "muonrun: out of memory\n");
    remove_store(store);
    return 1;
  }

  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  sa.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &sa, NULL); /* our own output may go away; the ranks keep running */

  fflush(stdout);
  fflush(stderr);
  for (i = 0; i < n; i++) {
    int p[2][2], k;
    for (k = 0; k < 2; k++) {
      if (pipe(p[k]) != 0) {
        fprintf(stderr, "muonrun: pipe: %s\n", strerror(errno));
        signal_all(ch, i, SIGKILL);
        while (wait(NULL) > 0) {}
        remove_store(store);
        return 1;
      }
      fcntl(p[k][0], F_SETFD, FD_CLOEXEC);
      fcntl(p[k][1], F_SETFD, FD_CLOEXEC);
    }
    ch[i].pid = fork();
    if (ch[i].pid < 0) {
      fprintf(stderr, "muonrun: fork: %s\n", strerror(errno));
      ch[i].pid = 0;
      signal_all(ch, i, SIGKILL);
      while (wait(NULL) > 0) {}
      remove_store(store);
      return 1;
    }
    if (ch[i].pid == 0) {
      char num[32];
      struct sigaction dfl;
      memset(&dfl, 0, sizeof dfl);
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      sigaction(SIGPIPE, &dfl, NULL);
      sigaction(SIGINT, &dfl, NULL);
      sigaction(SIGTERM, &dfl, NULL);
      sigaction(SIGHUP, &dfl, NULL);
#ifdef __linux__
      prctl(PR_SET_PDEATHSIG, SIGKILL);   /* muonrun killed, even by SIGKILL: its ranks go too */
      if (getppid() != parent) _exit(127);
#endif
      if (dup2(p[0][1], 1) < 0 || dup2(p[1][1], 2) < 0) _exit(127);
      snprintf(num, sizeof num, "%d", i);
      setenv("MUON_RANK", num, 1);
      setenv("RANK", num, 1);
      setenv("LOCAL_RANK", num, 1);
      snprintf(num, sizeof num, "%d", n);
      setenv("MUON_WORLD_SIZE", num, 1);
      setenv("WORLD_SIZE", num, 1);
      setenv("LOCAL_WORLD_SIZE", num, 1);
      setenv("MUON_STORE", store, 1);
      execvp(argv[argi], argv + argi);
      fprintf(stderr, "muonrun: cannot run %s: %s\n", argv[argi], strerror(errno));
      _exit(127);
    }
    for (k = 0; k < 2; k++) {
      close(p[k][1]);
      ch[i].s[k].fd = p[k][0];
      ch[i].s[k].out_fd = k + 1;
      ch[i].s[k].buf = (char *)malloc(MUONRUN_LINE_MAX);
      ch[i].s[k].len = 0;
      if (!ch[i].s[k].buf) { /* cannot forward: drop this stream */
        close(ch[i].s[k].fd);
        ch[i].s[k].fd = -1;
      }
    }
  }

  {
    struct pollfd *pfd = (struct pollfd *)malloc((size_t)(2 * n) * sizeof *pfd);
    int *owner = (int *)malloc((size_t)(2 * n) * sizeof *owner);
    const double start = now_s();
    double kill_at = -1, drain_until = -1;
    int running = n, result = 0, failed_rank = -1, stopping = 0, timed_out = 0;
    int sent_kill = 0;

    if (!pfd || !owner) {
      fprintf(stderr, "muonrun: out of memory\n");
      signal_all(ch, n, SIGKILL);
      while (wait(NULL) > 0) {}
      remove_store(store);
      return 1;
    }
    for (;;) {
      int nfd = 0, open_streams = 0, wait_ms = 100, k;
      double t = now_s();

      /* reap */
      for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0) break;
        for (i = 0; i < n; i++) {
          if (ch[i].pid != pid) continue;
          ch[i].pid = 0;
          ch[i].status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
          running--;
          if (ch[i].status != 0 && !stopping) {
            result = ch[i].status;
            failed_rank = i;
            if (WIFSIGNALED(st))
              fprintf(stderr, "muonrun: rank %d was killed by signal %d; stopping the others\n",
                      i, WTERMSIG(st));
            else
              fprintf(stderr, "muonrun: rank %d exited with status %d; stopping the others\n", i,
                      ch[i].status);
            stopping = 1;
            signal_all(ch, n, SIGTERM);
            kill_at = t + grace;
          }
        }
      }
      if (!stopping && muonrun_signal) {
        fprintf(stderr, "muonrun: got signal %d; stopping the ranks\n", (int)muonrun_signal);
        result = 128 + (int)muonrun_signal;
        stopping = 1;
        signal_all(ch, n, SIGTERM);
        kill_at = t + grace;
      }
      if (!stopping && timeout > 0 && t - start >= timeout) {
        fprintf(stderr, "muonrun: timeout after %g s; stopping the ranks\n", timeout);
        result = 124;
        timed_out = 1;
        stopping = 1;
        signal_all(ch, n, SIGTERM);
        kill_at = t + grace;
      }
      if (stopping && !sent_kill && running > 0 && t >= kill_at) {
        signal_all(ch, n, SIGKILL);
        sent_kill = 1;
      }

      for (i = 0; i < n; i++)
        for (k = 0; k < 2; k++)
          if (ch[i].s[k].fd >= 0) {
            pfd[nfd].fd = ch[i].s[k].fd;
            pfd[nfd].events = POLLIN;
            pfd[nfd].revents = 0;
            owner[nfd] = 2 * i + k;
            nfd++;
            open_streams++;
          }
      if (running == 0) {
        /* A grandchild may still hold a pipe: drain for at most a second more. */
        if (open_streams == 0) break;
        if (drain_until < 0) drain_until = t + 1;
        if (t >= drain_until) break;
      }
      if (stopping && !sent_kill && running > 0) {
        double left = kill_at - t;
        if (left * 1000 < wait_ms) wait_ms = left > 0 ? (int)(left * 1000) + 1 : 0;
      }
      if (!stopping && timeout > 0) {
        double left = start + timeout - t;
        if (left * 1000 < wait_ms) wait_ms = left > 0 ? (int)(left * 1000) + 1 : 0;
      }
      if (nfd == 0) {
        struct timespec ts;
        ts.tv_sec = 0;
        ts.tv_nsec = (long)wait_ms * 1000000L;
        nanosleep(&ts, NULL);
        continue;
      }
      if (poll(pfd, (nfds_t)nfd, wait_ms) > 0) {
        for (k = 0; k < nfd; k++)
          if (pfd[k].revents & (POLLIN | POLLHUP | POLLERR))
            pump(&ch[owner[k] / 2].s[owner[k] % 2], owner[k] / 2);
      }
    }
    for (i = 0; i < n; i++) {
      int k;
      for (k = 0; k < 2; k++) {
        if (ch[i].s[k].fd >= 0) {
          if (ch[i].s[k].len) emit_line(ch[i].s[k].out_fd, i, ch[i].s[k].buf, ch[i].s[k].len);
          close(ch[i].s[k].fd);
        }
        free(ch[i].s[k].buf);
      }
    }
    free(pfd);
    free(owner);
    remove_store(store);
    (void)failed_rank;
    (void)timed_out;
    free(ch);
    return result;
  }
}
