/* An exec-mode handler that leaves a grandchild behind: it forks a child that outlives it by a
 * few milliseconds, answers, and exits. As PID 1 the wrapper must reap every such orphan.
 * Build: cc -O2 -o forker forker.c */
#include <stdio.h>
#include <unistd.h>

int main(void) {
    pid_t pid = fork();
    if (pid == 0) {
        /* the grandchild: let go of the answer pipes, outlive the parent, exit */
        close(0);
        close(1);
        close(2);
        usleep(5000);
        _exit(0);
    }
    printf("{\"statusCode\":200,\"body\":\"forked %d\"}\n", (int)pid);
    return 0;
}
