/*
 * test_npu.c -- feature discovery: the probe agrees with the kernel's view
 * (/proc/cpuinfo) and with itself.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "npu.h"

/* Whether /proc/cpuinfo's flags line lists flag (as a whole word). */
static bool cpuinfo_has(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    cr_assert(f);
    char line[8192];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        char *save = NULL;
        for (char *tok = strtok_r(line, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save))
            if (strcmp(tok, flag) == 0)
                found = true;
        break;
    }
    fclose(f);
    return found;
}

Test(npu, probe_matches_cpuinfo) {
    const npu_features_t *f = npu_probe();
    cr_expect_eq(f->avx512f, cpuinfo_has("avx512f"));
    cr_expect_eq(f->avx512_vnni, cpuinfo_has("avx512_vnni"));
    cr_expect_eq(f->avx512_bf16, cpuinfo_has("avx512_bf16"));
    cr_expect_eq(f->amx_int8, cpuinfo_has("amx_int8"));
    cr_expect_eq(f->amx_bf16, cpuinfo_has("amx_bf16"));
    cr_expect(!f->amx_usable || f->amx_tile, "AMX usable implies the tile bit");
    cr_expect_geq(f->n_cpus, 1);
    cr_expect_eq(npu_probe(), f, "probed once");
}

Test(npu, describe_lists_what_is_present) {
    const npu_features_t *f = npu_probe();
    svc_buf_t             b;
    svc_buf_init(&b, 4096);
    cr_assert_eq(npu_features_describe(f, &b), SVC_OK);
    cr_expect_eq(strstr(b.data, "avx512f") != NULL, f->avx512f, "%s", b.data);
    npu_features_t none = {0};
    svc_buf_reset(&b);
    cr_assert_eq(npu_features_describe(&none, &b), SVC_OK);
    cr_expect_str_eq(b.data, "none");
    svc_buf_fini(&b);
}
