/* replay.c - runs a fuzz target's LLVMFuzzerTestOneInput once over each input, without
   libFuzzer: built with the normal compiler (and its sanitizers, or gcov under make coverage),
   so the committed corpora are replayed where clang is missing and their coverage is counted.

   usage: build/fuzz_state_replay FILE|DIR...   (a directory: every file in it, in name order)
   Prints "<n> inputs replayed: 1 passed, 0 failed"; a failing input aborts inside the target
   (FUZZ_VERBOSE=1 names each input before it runs). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replayed;

static void run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  unsigned char *buf;
  long n;
  if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fprintf(stderr, "replay: cannot read %s\n", path);
    exit(1);
  }
  buf = (unsigned char *)malloc(n ? (size_t)n : 1);
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "replay: cannot read %s\n", path);
    exit(1);
  }
  fclose(f);
  if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "replay: %s\n", path);
  LLVMFuzzerTestOneInput(buf, (size_t)n);
  free(buf);
  replayed++;
}

static int by_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void run_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char **names = NULL;
  size_t n = 0, cap = 0, i;
  if (!d) { fprintf(stderr, "replay: cannot open %s\n", dir); exit(1); }
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      names = (char **)realloc(names, cap * sizeof *names);
      if (!names) exit(1);
    }
    names[n] = (char *)malloc(strlen(dir) + strlen(e->d_name) + 2);
    if (!names[n]) exit(1);
    sprintf(names[n], "%s/%s", dir, e->d_name);
    n++;
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, by_name);
  for (i = 0; i < n; i++) {
    run_file(names[i]);
    free(names[i]);
  }
  free(names);
}

int main(int argc, char **argv) {
  int i;
  struct stat st;
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
    return 2;
  }
  for (i = 1; i < argc; i++) {
    if (stat(argv[i], &st) != 0) { fprintf(stderr, "replay: %s not found\n", argv[i]); return 1; }
    if (S_ISDIR(st.st_mode)) run_dir(argv[i]); else run_file(argv[i]);
  }
  printf("%d inputs replayed: 1 passed, 0 failed\n", replayed);
  return 0;
}
