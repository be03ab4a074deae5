/*
 * test_npu.c -- feature discovery: the probe agrees with the kernel's view
 * (/proc/cpuinfo) and with itself.
 */
#include <criterion/criterion.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    cr_expect_eq(f->avx512dq, cpuinfo_has("avx512dq"));
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

static bool write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    bool  ok = f && fputs(text, f) >= 0;
    return f ? fclose(f) == 0 && ok : false;
}

/* A CPU quota on the process's cgroup (docker --cpus, CPUQuota=) caps the
 * CPUs the pool sizes itself by: half a CPU's time on a machine of two or
 * more is one thread. Needs root and a cgroup v1 cpu controller (the v2
 * file, cpu.max, is read by the same walk); skips elsewhere. The process
 * is this test's own (Criterion forks one per test). */
Test(npu, cgroup_quota_caps_the_cpus) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) < 2)
        cr_skip_test("one CPU: nothing to cap");
    char dir[128], path[160], pid[32];
    snprintf(dir, sizeof dir, "/sys/fs/cgroup/cpu/d3test-%d", (int)getpid());
    if (mkdir(dir, 0755) != 0)
        cr_skip_test("cannot make a cgroup v1 cpu group here (not root, or cgroup v2 only)");
    snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
    bool quota = write_file(path, "50000"); /* of the default 100000 us period */
    snprintf(path, sizeof path, "%s/tasks", dir);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    bool moved = quota && write_file(path, pid);
    int  n = moved ? npu_probe()->n_cpus : -1;
    write_file("/sys/fs/cgroup/cpu/tasks", pid);
    rmdir(dir);
    cr_assert(moved, "could not put the test in its cgroup");
    cr_expect_eq(n, 1, "n_cpus %d under a quota of half a CPU", n);
}
