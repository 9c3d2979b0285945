/* json-tools: the parser of json-check.c as typed functions of a
 * WebAssembly component (world json-tools in json-tools.wit), exported by
 * the component model's canonical ABI, written out by hand here (Debian has
 * no wit-bindgen): each function takes its arguments as the ABI flattens
 * them and returns a pointer to its result laid out in linear memory.
 * scripts/build-wasm-example.sh builds it with clang-14 and wasi-libc and
 * turns it into a component (cordon-wasm-componentize). */
#define JSON_CHECK_LIBRARY
#include "json-check.c"

#include <stdint.h>

/* The ABI's allocator: the host asks it for room for the arguments. */
__attribute__((export_name("cabi_realloc")))
void *cabi_realloc(void *old, size_t old_size, size_t align, size_t new_size) {
    (void)old_size;
    (void)align; /* malloc's alignment (16) covers every ABI alignment */
    if (new_size == 0)
        return (void *)align;
    void *p = realloc(old, new_size);
    if (!p)
        __builtin_trap();
    return p;
}

static void reset(const unsigned char *doc, size_t len) {
    s = doc;
    n = len;
    pos = 0;
    values = 0;
    max_depth = 0;
    error = NULL;
}

/* The whole document parsed: 1 if valid. */
static int parse(void) {
    int ok = value(0);
    if (ok) {
        ws();
        if (pos < n)
            ok = fail("trailing data");
    }
    return ok;
}

/* result<summary, invalid>: the case at 0, the payload at 8 (both records
 * are aligned to 8). summary {values: u64 @8, depth: u32 @16};
 * invalid {byte: u64 @8, reason: string (ptr @16, len @20)}. */
static _Alignas(8) uint8_t check_ret[24];

__attribute__((export_name("check")))
uint8_t *check(const unsigned char *doc, size_t len) {
    reset(doc, len);
    int ok = parse();
    memset(check_ret, 0, sizeof check_ret);
    if (ok) {
        check_ret[0] = 0;
        *(uint64_t *)(check_ret + 8) = values;
        *(uint32_t *)(check_ret + 16) = (uint32_t)max_depth;
    } else {
        check_ret[0] = 1;
        *(uint64_t *)(check_ret + 8) = pos;
        *(const char **)(check_ret + 16) = error;
        *(uint32_t *)(check_ret + 20) = (uint32_t)strlen(error);
    }
    free((void *)doc);
    return check_ret;
}

/* list<string> arrives as (ptr, len) of (ptr, len) pairs; option<u32> as a
 * case (0 none, 1 some) and the value. list<bool> returns as (ptr, len)
 * at the returned pointer. */
static _Alignas(4) uint8_t check_all_ret[8];

__attribute__((export_name("check-all")))
uint8_t *check_all(const uint32_t *docs, size_t count, uint32_t has_max, uint32_t max) {
    uint8_t *out = malloc(count ? count : 1);
    if (!out)
        __builtin_trap();
    for (size_t i = 0; i < count; i++) {
        const unsigned char *doc = (const unsigned char *)(uintptr_t)docs[2 * i];
        reset(doc, docs[2 * i + 1]);
        int ok = parse();
        if (ok && has_max && max_depth > max)
            ok = 0;
        out[i] = (uint8_t)ok;
        free((void *)doc);
    }
    free((void *)docs);
    *(uint8_t **)(check_all_ret) = out;
    *(uint32_t *)(check_all_ret + 4) = (uint32_t)count;
    return check_all_ret;
}

/* After the host has read a result, the memory it pointed at is freed. */
__attribute__((export_name("cabi_post_check-all")))
void post_check_all(uint8_t *ret) {
    free(*(uint8_t **)ret);
}
