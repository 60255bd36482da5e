/* A persistent-mode worker in C: reads one request envelope per line on stdin and answers
 * {"statusCode":200,"body":<the request's body>} on one line. The body string is copied as it
 * is still JSON-escaped, so no JSON library is needed. Build: cc -O2 -o echo_worker echo_worker.c */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    size_t cap = 0;
    char *line = NULL;
    ssize_t n;
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    while ((n = getline(&line, &cap, stdin)) > 0) {
        const char *body = strstr(line, "\"body\":\"");
        const char *start = body ? body + 8 : "";
        const char *end = start;
        /* the closing quote is the first one not escaped by a backslash */
        while (body && *end && *end != '"') end += (*end == '\\' && end[1]) ? 2 : 1;
        fputs("{\"statusCode\":200,\"headers\":{\"Content-Type\":\"text/plain\"},\"body\":\"", stdout);
        fwrite(start, 1, (size_t)(end - start), stdout);
        fputs("\"}\n", stdout);
        fflush(stdout);
    }
    free(line);
    return 0;
}
