/* json-check: a strict JSON (RFC 8259) validator, the parser of
 * examples/wasm.yaml. Reads one document from stdin (or from the file named
 * by its only argument) and prints either
 *   ok: N values, depth D
 * and exits 0, or
 *   invalid: byte N: REASON
 * and exits 1. It is built for wasm32-wasi (runtime: wasm) and natively (the
 * benchmark's native P1 comparison) from this one source; json-tools.c
 * includes it with JSON_CHECK_LIBRARY defined (the parser without main). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 512

static const unsigned char *s;
static size_t n, pos, values, max_depth;
static const char *error;

static int fail(const char *why) {
    if (!error)
        error = why;
    return 0;
}

static void ws(void) {
    while (pos < n && (s[pos] == ' ' || s[pos] == '\t' || s[pos] == '\n' || s[pos] == '\r'))
        pos++;
}

static int lit(const char *w) {
    size_t l = strlen(w);
    if (n - pos < l || memcmp(s + pos, w, l) != 0)
        return fail("unknown literal");
    pos += l;
    return 1;
}

static int hex4(void) {
    for (int i = 0; i < 4; i++, pos++) {
        if (pos >= n)
            return fail("unterminated \\u escape");
        unsigned char c = s[pos];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return fail("bad \\u escape");
    }
    return 1;
}

/* One UTF-8 sequence starting at pos (a byte >= 0x80). */
static int utf8(void) {
    unsigned char c = s[pos];
    size_t len;
    unsigned min;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return fail("invalid UTF-8");
    if (n - pos < len)
        return fail("truncated UTF-8");
    for (size_t i = 1; i < len; i++) {
        unsigned char d = s[pos + i];
        if ((d & 0xc0) != 0x80)
            return fail("invalid UTF-8");
        cp = (cp << 6) | (d & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return fail("invalid UTF-8");
    pos += len;
    return 1;
}

static int string(void) {
    pos++; /* the opening quote */
    while (pos < n) {
        unsigned char c = s[pos];
        if (c == '"') {
            pos++;
            return 1;
        }
        if (c < 0x20)
            return fail("control character in string");
        if (c == '\\') {
            pos++;
            if (pos >= n)
                return fail("unterminated escape");
            c = s[pos++];
            if (c == 'u') {
                if (!hex4())
                    return 0;
            } else if (!strchr("\"\\/bfnrt", c) || c == 0) {
                return fail("bad escape");
            }
        } else if (c >= 0x80) {
            if (!utf8())
                return 0;
        } else {
            pos++;
        }
    }
    return fail("unterminated string");
}

static int digits(void) {
    size_t start = pos;
    while (pos < n && s[pos] >= '0' && s[pos] <= '9')
        pos++;
    return pos > start ? 1 : fail("digit expected");
}

static int number(void) {
    if (s[pos] == '-')
        pos++;
    if (pos < n && s[pos] == '0')
        pos++;
    else if (!digits())
        return 0;
    if (pos < n && s[pos] == '.') {
        pos++;
        if (!digits())
            return 0;
    }
    if (pos < n && (s[pos] == 'e' || s[pos] == 'E')) {
        pos++;
        if (pos < n && (s[pos] == '+' || s[pos] == '-'))
            pos++;
        if (!digits())
            return 0;
    }
    return 1;
}

static int value(size_t depth);

static int container(size_t depth, unsigned char close) {
    if (depth > MAX_DEPTH)
        return fail("nested too deep");
    if (depth > max_depth)
        max_depth = depth;
    pos++;
    ws();
    if (pos < n && s[pos] == close) {
        pos++;
        return 1;
    }
    for (;;) {
        if (close == '}') {
            ws();
            if (pos >= n || s[pos] != '"')
                return fail("object key expected");
            if (!string())
                return 0;
            ws();
            if (pos >= n || s[pos] != ':')
                return fail("':' expected");
            pos++;
        }
        if (!value(depth))
            return 0;
        ws();
        if (pos >= n)
            return fail("unterminated container");
        if (s[pos] == close) {
            pos++;
            return 1;
        }
        if (s[pos] != ',')
            return fail(close == '}' ? "',' or '}' expected" : "',' or ']' expected");
        pos++;
    }
}

static int value(size_t depth) {
    ws();
    if (pos >= n)
        return fail("value expected");
    values++;
    switch (s[pos]) {
    case '{': return container(depth + 1, '}');
    case '[': return container(depth + 1, ']');
    case '"': return string();
    case 't': return lit("true");
    case 'f': return lit("false");
    case 'n': return lit("null");
    default:
        if (s[pos] == '-' || (s[pos] >= '0' && s[pos] <= '9'))
            return number();
        return fail("value expected");
    }
}

#ifndef JSON_CHECK_LIBRARY
#ifdef __wasm__
/* The canonical ABI's allocator, for the component build of this program
 * (scripts/build-wasm-example.sh): with it, wasmtime's preview 1 adapter
 * takes the memory it keeps from malloc; without it, the adapter grows
 * linear memory itself, under the feet of this wasi-libc's malloc, which
 * then hands out the adapter's pages. */
__attribute__((export_name("cabi_realloc")))
void *cabi_realloc(void *old, size_t old_size, size_t align, size_t new_size) {
    (void)old_size;
    (void)align; /* malloc's alignment (16) covers the adapter's */
    void *p = realloc(old, new_size ? new_size : 1);
    if (!p)
        abort();
    return p;
}
#endif

int main(int argc, char **argv) {
    FILE *in = stdin;
    if (argc > 2) {
        fprintf(stderr, "usage: %s [FILE]\n", argv[0]);
        return 2;
    }
    if (argc == 2 && !(in = fopen(argv[1], "rb"))) {
        perror(argv[1]);
        return 2;
    }
    size_t cap = 1 << 16;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        fputs("out of memory\n", stderr);
        return 2;
    }
    for (;;) {
        if (n == cap) {
            cap *= 2;
            unsigned char *b = realloc(buf, cap);
            if (!b) {
                fputs("out of memory\n", stderr);
                return 2;
            }
            buf = b;
        }
        size_t r = fread(buf + n, 1, cap - n, in);
        if (r == 0)
            break;
        n += r;
    }
    if (ferror(in)) {
        perror("read");
        return 2;
    }
    s = buf;
    int ok = value(0);
    if (ok) {
        ws();
        if (pos < n)
            ok = fail("trailing data");
    }
    if (!ok) {
        printf("invalid: byte %zu: %s\n", pos, error);
        return 1;
    }
    printf("ok: %zu values, depth %zu\n", values, max_depth);
    return 0;
}
#endif
