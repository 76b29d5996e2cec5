/* netrelay - a packet delay and loss emulator for kernels without netem (tests/run_netns.sh).

   usage: netrelay --dev NAME --delay-ms D [--loss P] [--seed S] [--seconds T]

   Attaches to the TUN device NAME (made beforehand: `ip tuntap add dev NAME mode tun`, in the
   router namespace whose policy routing sends the forwarded packets into it) and writes every
   IP packet it reads back into the same device D milliseconds later, in arrival order, so the
   kernel routes it on to its destination. With --loss P (a fraction, 0.01 = 1 %) each packet is
   dropped instead with probability P, independently (xorshift64*, --seed, default 1): real
   packet loss, which TCP repairs by retransmission. A packet that finds the queue full (8192
   packets) is dropped too and counted apart. Both directions of a connection pass through the
   relay, so a flow's round trip gains 2 D: D = 5 gives a 10 ms RTT.

   Stops by itself after --seconds T (default 600) or on SIGTERM / SIGINT / SIGHUP, and prints
   one line to stderr: packets read, forwarded, dropped as loss, dropped as overflow.

   Linux only (TUN, ppoll). Build: cc -std=c99 -Wall -Wextra -Wpedantic -O2 tools/netrelay.c */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define QUEUE 8192          /* packets held at once */
#define PACKET 65536        /* the largest IP packet */

typedef struct slot { int64_t due_ns; int len; unsigned char *data; } slot;

static volatile sig_atomic_t stop_now;
static void on_signal(int sig) { (void)sig; stop_now = 1; }

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* xorshift64*: a uniform double in [0, 1). */
static double uniform(uint64_t *s) {
  *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
  return (double)((*s * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

static int open_tun(const char *name) {
  struct ifreq ifr;
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK);
  if (fd < 0) { fprintf(stderr, "netrelay: /dev/net/tun: %s\n", strerror(errno)); return -1; }
  memset(&ifr, 0, sizeof ifr);
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name);
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
    fprintf(stderr, "netrelay: TUNSETIFF %s: %s\n", name, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

int main(int argc, char **argv) {
  const char *dev = NULL;
  double delay_ms = -1, loss = 0, seconds = 600;
  uint64_t seed = 1;
  long long got = 0, sent = 0, lost = 0, overflow = 0;
  slot *q;
  int head = 0, count = 0, fd, i;
  int64_t delay_ns, end_ns;
  struct sigaction sa;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dev") && i + 1 < argc) dev = argv[++i];
    else if (!strcmp(argv[i], "--delay-ms") && i + 1 < argc) delay_ms = atof(argv[++i]);
    else if (!strcmp(argv[i], "--loss") && i + 1 < argc) loss = atof(argv[++i]);
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else { dev = NULL; break; }
  }
  if (!dev || !(delay_ms >= 0) || !(loss >= 0 && loss < 1) || !(seconds > 0) || !seed) {
    fprintf(stderr, "usage: netrelay --dev NAME --delay-ms D [--loss P (0..1)] [--seed S > 0] [--seconds T]\n");
    return 2;
  }
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  if ((fd = open_tun(dev)) < 0) return 1;
  q = (slot *)calloc(QUEUE, sizeof *q);
  for (i = 0; q && i < QUEUE; i++)
    if (!(q[i].data = (unsigned char *)malloc(PACKET))) { q = NULL; break; }
  if (!q) { fprintf(stderr, "netrelay: out of memory\n"); return 1; }
  delay_ns = (int64_t)(delay_ms * 1e6);
  end_ns = now_ns() + (int64_t)(seconds * 1e9);
  while (!stop_now && now_ns() < end_ns) {
    struct pollfd p;
    struct timespec wait;
    int64_t t = now_ns(), w = 100000000;   /* at most 100 ms between checks of the clock */
    /* out: every packet whose time has come, oldest first (one delay keeps the queue in order) */
    while (count && q[head].due_ns <= t) {
      if (write(fd, q[head].data, (size_t)q[head].len) == q[head].len) sent++;
      else if (errno == EAGAIN) break;       /* the kernel's side is full: retry shortly */
      head = (head + 1) % QUEUE;
      count--;
    }
    if (count && q[head].due_ns - t < w) w = q[head].due_ns > t ? q[head].due_ns - t : 20000;
    wait.tv_sec = (time_t)(w / 1000000000);
    wait.tv_nsec = (long)(w % 1000000000);
    p.fd = fd;
    p.events = POLLIN;
    p.revents = 0;
    if (ppoll(&p, 1, &wait, NULL) < 0 && errno != EINTR) { perror("netrelay: ppoll"); break; }
    if (!(p.revents & POLLIN)) continue;
    /* in: every packet waiting, stamped with its time to leave */
    for (;;) {
      slot *s = &q[(head + count) % QUEUE];
      unsigned char scratch[1];
      ssize_t n = read(fd, count < QUEUE ? s->data : scratch, count < QUEUE ? PACKET : 1);
      if (n < 0) {
        if (errno != EAGAIN && errno != EINTR) { perror("netrelay: read"); stop_now = 1; }
        break;
      }
      got++;
      if (count == QUEUE) { overflow++; continue; }
      if (loss > 0 && uniform(&seed) < loss) { lost++; continue; }
      s->len = (int)n;
      s->due_ns = now_ns() + delay_ns;
      count++;
    }
  }
  fprintf(stderr, "netrelay %s: delay %.3g ms, loss %.3g: %lld packets read, %lld forwarded, %lld dropped as loss, %lld as overflow\n",
          dev, delay_ms, loss, got, sent, lost, overflow);
  close(fd);
  return 0;
}
