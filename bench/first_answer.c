/* Time from exec of the wrapper to its first answered request: fork, exec the given command
 * (with PORT in its environment), poll 127.0.0.1:PORT until a GET / gets a full response, kill
 * the process group. Prints microseconds. With PROBE=1 in the environment the request carries
 * K-Network-Probe (answered by the wrapper itself, no handler spawned).
 * Build: cc -O2 -o first_answer first_answer.c; run: first_answer PORT cmd args... */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int port = atoi(argv[1]);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        execvp(argv[2], argv + 2);
        _exit(127);
    }
    const char *probe = getenv("PROBE");
    const char *req = probe && *probe == '1'
        ? "GET / HTTP/1.1\r\nHost: x\r\nK-Network-Probe: queue\r\nConnection: close\r\n\r\n"
        : "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    char buf[4096];
    for (int tries = 0; tries < 200000; tries++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) {
            if (write(s, req, strlen(req)) > 0) {
                ssize_t n, got = 0;
                while ((n = read(s, buf, sizeof buf)) > 0) got += n;
                if (got > 12 && memcmp(buf, "HTTP/1.1 200", 12) == 0) {
                    clock_gettime(CLOCK_MONOTONIC, &t1);
                    close(s);
                    kill(-pid, SIGKILL);
                    waitpid(pid, NULL, 0);
                    printf("%.0f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3);
                    return 0;
                }
            }
        }
        close(s);
        usleep(50);
    }
    kill(-pid, SIGKILL);
    return 1;
}
