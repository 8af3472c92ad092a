/* The test node's workload: a static binary for images built without a base (kube/images.py).
 *   workload                 sleep until SIGTERM, then exit 0
 *   workload hog MIB         touch MIB mebibytes, then sleep (a memory limit below it: OOMKilled)
 *   workload true            exit 0 at once (an exec probe that passes)
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stopping = 0;

static void on_term(int sig) {
  (void)sig;
  stopping = 1;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "true") == 0) return 0;
  if (argc > 2 && strcmp(argv[1], "hog") == 0) {
    long mib = atol(argv[2]);
    for (long i = 0; i < mib; i++) {
      char *chunk = malloc(1 << 20);
      if (chunk == NULL) return 1;
      memset(chunk, 1, 1 << 20);
    }
    printf("holding %ld MiB\n", mib);
    fflush(stdout);
  }
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  while (!stopping) pause();
  printf("stopping on SIGTERM\n");
  return 0;
}
