// The floor under brig serve's latency bars on this machine: the same requests
// (bench/daemon_load.py, one kept-alive connection) answered by the least a server
// can do. No sandbox, no state, no audit, no JSON parsing: a "create" is a constant
// answer, an "exec" runs `echo hello` (posix_spawn, vfork-style) with the
// environment brig's sandboxes get and answers with its output. What brig takes
// above this is brig's; what this takes is the machine's (loopback TCP, the wake-up
// of an idle vCPU, one fork + exec of echo).
//
//     cc -O2 -o http_floor bench/http_floor.c && ./http_floor PORT
//
// One connection at a time; written for the benchmark's client, not for anything else.
#define _GNU_SOURCE
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static void answer(int conn, const char *status, const char *type, const char *body) {
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %zu\r\n\r\n%s",
                   status, type, strlen(body), body);
  if (write(conn, buf, n) != n) perror("write");
}

static void run_echo(int conn) {
  // brig's default environment (brig-policy defaults): the locale matters, it is
  // loaded by every dynamically linked program.
  static char *envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                         "LANG=C.UTF-8", "HOME=/workspace", NULL};
  static char *argv[] = {"echo", "hello", NULL};
  int out[2];
  if (pipe(out)) {
    answer(conn, "500 Internal Server Error", "text/plain", "pipe");
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  pid_t pid;
  int failed = posix_spawn(&pid, "/bin/echo", &actions, NULL, argv, envp);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  char output[256];
  size_t got = 0;
  ssize_t n;
  while ((n = read(out[0], output + got, sizeof output - 1 - got)) > 0) got += n;
  close(out[0]);
  int status = 0;
  if (!failed) waitpid(pid, &status, 0);
  while (got > 0 && output[got - 1] == '\n') got--;
  output[got] = 0;
  char body[512];
  snprintf(body, sizeof body, "{\"stdout\":\"%s\\n\",\"stderr\":\"\",\"exit_code\":%d}", output,
           failed ? 127 : WEXITSTATUS(status));
  answer(conn, "200 OK", "application/json", body);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PORT\n", argv[0]);
    return 2;
  }
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_port = htons(atoi(argv[1])),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 16)) {
    perror("listen");
    return 1;
  }
  for (;;) {
    int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) continue;
    setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char request[65536];
    size_t have = 0;
    for (;;) {
      ssize_t n = read(conn, request + have, sizeof request - 1 - have);
      if (n <= 0) break;
      have += n;
      request[have] = 0;
      // Whole requests only: head, then content-length bytes of body.
      char *head_end;
      while ((head_end = strstr(request, "\r\n\r\n"))) {
        char *length = strcasestr(request, "content-length:");
        size_t body = length && length < head_end ? strtoul(length + 15, NULL, 10) : 0;
        size_t total = (size_t)(head_end - request) + 4 + body;
        if (have < total) break;
        if (!strncmp(request, "GET /metrics", 12)) {
          // daemon_load.py waits for a full pool before the back-to-back pattern.
          answer(conn, "200 OK", "text/plain", "brig_pool_ready{image=\"host\"} 1000\n");
        } else if (!strncmp(request, "GET /health", 11)) {
          answer(conn, "200 OK", "application/json", "{\"status\":\"ok\"}");
        } else if (!strncmp(request, "DELETE ", 7)) {
          if (write(conn, "HTTP/1.1 204 No Content\r\n\r\n", 27) != 27) perror("write");
        } else if (strstr(request, "/exec ")) {
          run_echo(conn);
        } else if (!strncmp(request, "POST /v1/sessions ", 18)) {
          answer(conn, "201 Created", "application/json", "{\"session_id\":\"floor\",\"pooled\":true}");
        } else {
          answer(conn, "404 Not Found", "application/json", "{\"error\":{\"code\":\"not_found\"}}");
        }
        memmove(request, request + total, have - total);
        have -= total;
        request[have] = 0;
      }
    }
    close(conn);
  }
}
