/* The pod sandbox's "pause" process: hold the pod's namespaces, reap zombies, exit on
 * SIGINT/SIGTERM. Built with `gcc -static -Os` by e2e/images (no registry needed). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(int argc, char **argv) {
  if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') { puts("pause (elastra) 1.0"); return 0; }
  if (getpid() != 1) fprintf(stderr, "pause: warning: not pid 1\n");
  struct sigaction sa = {0};
  sa.sa_handler = stop;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = reap;
  sa.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, NULL);
  for (;;) pause();
  return 42;
}
