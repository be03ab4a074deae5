/*
 * ops_devices.c -- `d3stream devices`: what runs where on this machine (the
 * CPU's extensions and the kernel paths of each profile; every NPU finding
 * with its reason), and the one --device choice of ask, serve, http and
 * bench with what the model card and /metrics say of it.
 *
 * The findings are npu_devices()'s; this file only reports them and makes
 * the choice npu_device_select() allows: in this build always the CPU.
 */
#include "ops_int.h"

#include "npu.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

static npu_device_req_t g_device = NPU_DEVICE_AUTO;

static const char *const REQ_NAME[] = {"auto", "cpu", "npu"};

/* ------------------------------------------------------------ the choice */

int ops_device_opt(const char *cmd, const char *arg) {
    for (size_t i = 0; i < sizeof REQ_NAME / sizeof REQ_NAME[0]; i++)
        if (strcmp(arg, REQ_NAME[i]) == 0) {
            g_device = (npu_device_req_t)i;
            return -1;
        }
    ops_fail(cmd, "--device \"%s\": expected auto, cpu or npu", arg);
    return OPS_EXIT_USAGE;
}

const char *ops_device_accelerator(void) {
    return "cpu"; /* npu_device_select: the only backend of this build */
}

svc_err_t ops_device_label(svc_buf_t *out) {
    const npu_features_t *f = npu_probe();
    svc_buf_t             feats;
    svc_buf_init(&feats, 4096);
    svc_err_t err = npu_features_describe(f, &feats);
    if (!err)
        err = svc_buf_addf(out, "cpu (%d cores, %s; kernels %s, matmul %s)", f->n_cpus, feats.data,
                           npu_kernels_name(), npu_matmul_name());
    svc_buf_fini(&feats);
    return err;
}

/* ------------------------------------------------------------ text report */

static const char *gen_name(npu_xdna_gen_t g) {
    return g == NPU_XDNA1 ? "XDNA1" : g == NPU_XDNA2 ? "XDNA2" : NULL;
}

static void print_version(FILE *o, const char *label, const npu_version_t *v, int parts) {
    if (!v->known)
        return;
    fprintf(o, "%s%u.%u", label, v->major, v->minor);
    if (parts > 2)
        fprintf(o, ".%u", v->patch);
    if (parts > 3)
        fprintf(o, ".%u", v->build);
}

static void print_node(FILE *o, const npu_accel_t *a) {
    fprintf(o, "  %s: %s\n    driver %s", a->path, a->ready ? "ready" : "not usable",
            a->driver[0] ? a->driver : "unknown");
    print_version(o, " ", &a->driver_version, 3);
    if (a->pci_known)
        fprintf(o, ", PCI %04x:%04x rev %02x", a->vendor, a->device, a->revision);
    if (gen_name(a->gen))
        fprintf(o, ", %s %s", gen_name(a->gen), a->chip ? a->chip : "(unknown revision)");
    if (a->vbnv[0])
        fprintf(o, " (\"%s\")", a->vbnv);
    fprintf(o, "\n    mode %03o, owner %u, group %s (%s), open: %s", a->mode & 0777u, a->uid,
            a->group[0] ? a->group : "?", a->in_group ? "a member" : "not a member",
            a->can_open ? "yes" : strerror(a->open_errno));
    print_version(o, ", AIE ", &a->aie, 2);
    if (a->cols)
        fprintf(o, ", %u columns x %u rows", a->cols, a->rows);
    print_version(o, ", firmware ", &a->firmware, 4);
    if (a->firmware.known)
        fprintf(o, " (%s)", a->firmware_from);
    fprintf(o, "\n    %s\n", a->reason);
}

/* The NPU part of the report (also what --device npu prints). */
static void print_npu(FILE *o, const npu_devices_t *d) {
    fprintf(o, "npu: %s\n  present: %s, ready: %s, backend: none in this build\n", d->reason,
            d->present ? "yes" : "no", d->ready ? "yes" : "no");
    for (size_t i = 0; i < d->n_accel; i++)
        print_node(o, &d->accel[i]);
    if (d->n_accel_all > d->n_accel)
        fprintf(o, "  (%zu more nodes, not described)\n", d->n_accel_all - d->n_accel);
    fprintf(o, "  memlock: %s\n  xrt: %s\n", d->memlock.reason, d->xrt.reason);
}

static void print_cpu(FILE *o, const npu_features_t *f, const char *vec, const char *mat) {
    char        mm[256];
    const char *dnnl = npu_dnnl_refusal();
    ops_matmul_desc(mm, sizeof mm);
    fprintf(o, "cpu: %d CPUs for the kernels (affinity %d", f->n_cpus, f->n_affinity);
    if (f->cpu_quota > 0)
        fprintf(o, ", cgroup quota %.2f CPUs)", f->cpu_quota);
    else
        fprintf(o, ", no cgroup quota)");
    fprintf(o, ", pool threads %zu\n  vector: %s\n  matrix: %s\n  onednn: %s\n", npu_threads(), vec,
            mat, dnnl ? dnnl : "usable");
    fprintf(o, "  profile exact: kernels %s, matmul %s\n", npu_kernels_name(), mm);
    if (npu_fast_usable())
        fprintf(o, "  profile fast: kernels %s, matmul %s\n", npu_kernels_name(),
                npu_matmul_fast_name());
    else
        fprintf(o, "  profile fast: the exact kernels (no AVX-512 VNNI path here)\n");
}

/* ------------------------------------------------------------ JSON report */

static json_t *version_json(const npu_version_t *v, int parts) {
    char s[64];
    if (!v->known)
        return json_null();
    if (parts == 2)
        snprintf(s, sizeof s, "%u.%u", v->major, v->minor);
    else if (parts == 3)
        snprintf(s, sizeof s, "%u.%u.%u", v->major, v->minor, v->patch);
    else
        snprintf(s, sizeof s, "%u.%u.%u.%u", v->major, v->minor, v->patch, v->build);
    return json_string(s);
}

static json_t *str_or_null(const char *s) {
    return s && *s ? json_string(s) : json_null();
}

/* "a b c" -> ["a","b","c"]; "none" -> []. */
static json_t *words_json(const char *s) {
    json_t *a = json_array();
    if (strcmp(s, "none") == 0)
        return a;
    for (const char *p = s; a && *p;) {
        size_t n = strcspn(p, " ");
        json_array_append_new(a, json_stringn(p, n));
        p += n + (p[n] == ' ');
    }
    return a;
}

static json_t *node_json(const npu_accel_t *a) {
    char mode[8], pci[3][8];
    snprintf(mode, sizeof mode, "%04o", a->mode & 07777u);
    snprintf(pci[0], sizeof pci[0], "0x%04x", a->vendor);
    snprintf(pci[1], sizeof pci[1], "0x%04x", a->device);
    snprintf(pci[2], sizeof pci[2], "0x%02x", a->revision);
    json_t *pcij = a->pci_known ? json_pack("{s:s, s:s, s:s}", "vendor", pci[0], "device", pci[1],
                                            "revision", pci[2])
                                : json_null();
    return json_pack("{s:s, s:o, s:o, s:b, s:o, s:o, s:o, s:o, s:s, s:i, s:s, s:b, s:b, s:o, "
                     "s:o, s:i, s:i, s:o, s:o, s:b, s:s}",
                     "path", a->path, "driver", str_or_null(a->driver), "driver_version",
                     version_json(&a->driver_version, 3), "amdxdna", a->amdxdna, "pci", pcij,
                     "generation", str_or_null(gen_name(a->gen)), "chip", str_or_null(a->chip),
                     "vbnv", str_or_null(a->vbnv), "mode", mode, "uid", (int)a->uid, "group",
                     a->group, "in_group", a->in_group, "can_open", a->can_open, "open_error",
                     a->can_open ? json_null() : json_string(strerror(a->open_errno)),
                     "aie_version", version_json(&a->aie, 2), "columns", (int)a->cols, "rows",
                     (int)a->rows, "firmware", version_json(&a->firmware, 4), "firmware_from",
                     str_or_null(a->firmware_from), "ready", a->ready, "reason", a->reason);
}

static json_t *limit_json(uint64_t v) {
    return v == UINT64_MAX ? json_string("unlimited") : json_integer((json_int_t)v);
}

static json_t *npu_json(const npu_devices_t *d) {
    json_t *nodes = json_array();
    for (size_t i = 0; nodes && i < d->n_accel; i++)
        json_array_append_new(nodes, node_json(&d->accel[i]));
    const npu_memlock_t *m = &d->memlock;
    const npu_xrt_t     *x = &d->xrt;
    char                 min[16];
    snprintf(min, sizeof min, "%d.%d", NPU_XRT_MIN_MAJOR, NPU_XRT_MIN_MINOR);
    return json_pack(
        "{s:b, s:b, s:b, s:s, s:o, s:I, s:{s:o, s:o, s:b, s:s}, s:{s:b, s:o, s:o, s:s, s:b, s:s}}",
        "present", d->present, "ready", d->ready, "backend", 0, "reason", d->reason, "nodes", nodes,
        "nodes_found", (json_int_t)d->n_accel_all, "memlock", "soft",
        m->known ? limit_json(m->soft) : json_null(), "hard",
        m->known ? limit_json(m->hard) : json_null(), "ok", m->ok, "reason", m->reason, "xrt",
        "found", x->found, "library", str_or_null(x->library), "version",
        version_json(&x->version, 3), "minimum", min, "new_enough", x->new_enough, "reason",
        x->reason);
}

static json_t *cpu_json(const npu_features_t *f, const char *vec, const char *mat) {
    const char *dnnl = npu_dnnl_refusal();
    bool        fast = npu_fast_usable();
    json_t     *exact = json_pack("{s:s, s:s, s:s, s:s}", "kernels", npu_kernels_name(), "matmul",
                                  npu_matmul_name(), "matmul_quantised", npu_matmul_quantised_name(),
                                  "matmul_groups", npu_matmul_groups_name());
    json_t     *fastj =
        json_pack("{s:s, s:s, s:b}", "kernels", npu_kernels_name(), "matmul",
                  fast ? npu_matmul_fast_name() : npu_matmul_name(), "own_kernels", fast);
    return json_pack("{s:i, s:i, s:o, s:I, s:o, s:o, s:b, s:s, s:{s:o, s:o}}", "cpus", f->n_cpus,
                     "affinity_cpus", f->n_affinity, "cgroup_cpu_quota",
                     f->cpu_quota > 0 ? json_real(f->cpu_quota) : json_null(), "threads",
                     (json_int_t)npu_threads(), "vector", words_json(vec), "matrix",
                     words_json(mat), "amx_usable", f->amx_usable, "onednn", dnnl ? dnnl : "usable",
                     "profiles", "exact", exact, "fast", fastj);
}

/* ------------------------------------------------------------ the command */

static const char DEVICES_HELP[] =
    "Usage: d3stream devices [--json]\n"
    "\n"
    "What runs where on this machine. The CPU: the CPUs the kernels may use (the\n"
    "affinity mask, capped by a cgroup CPU quota), the pool's threads, the vector\n"
    "and matrix extensions, whether oneDNN may run, and the kernel paths each\n"
    "profile takes (exact, fast). The NPU: every /dev/accel/accel* node (its DRM\n"
    "driver, PCI id and XDNA generation, owner, group and whether this process may\n"
    "open it, the AIE version and columns, the firmware), RLIMIT_MEMLOCK, and XRT\n"
    "(libxrt_coreutil, its version: XDNA needs 2.17 or later), each with the reason\n"
    "it is or is not what an XDNA backend needs; then what --device auto picks.\n"
    "This build has no XDNA backend, so it is always the CPU; the report says what\n"
    "is there and what is missing (docs/devices.md).\n"
    "\n"
    "  --json    one JSON object: {\"cpu\": {...}, \"npu\": {...}, \"device\": {...}}\n"
    "\n"
    "Exit status: 0 printed, 2 usage.\n";

static int devices_print(bool as_json) {
    const npu_features_t *f = npu_probe();
    const npu_devices_t  *d = npu_devices();
    char                  why[2048];
    svc_buf_t             vec, mat;
    svc_buf_init(&vec, 4096);
    svc_buf_init(&mat, 4096);
    /* auto always has the CPU: rc is never the refusal */
    int rc =
        npu_device_select(d, NPU_DEVICE_AUTO, why, sizeof why) ? OPS_EXIT_FAILURE : OPS_EXIT_OK;
    if (rc == OPS_EXIT_OK && (npu_features_describe_kind(f, NPU_FEATURES_VECTOR, &vec) ||
                              npu_features_describe_kind(f, NPU_FEATURES_MATRIX, &mat)))
        rc = OPS_EXIT_FAILURE;
    else if (rc == OPS_EXIT_OK && as_json) {
        json_t *j =
            json_pack("{s:o, s:o, s:{s:s, s:s, s:s}}", "cpu", cpu_json(f, vec.data, mat.data),
                      "npu", npu_json(d), "device", "requested", "auto", "accelerator",
                      ops_device_accelerator(), "reason", why);
        char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (!s || puts(s) < 0)
            rc = OPS_EXIT_FAILURE;
        free(s);
        json_decref(j);
    } else if (rc == OPS_EXIT_OK) {
        print_cpu(stdout, f, vec.data, mat.data);
        print_npu(stdout, d);
        printf("device: auto -> %s\n", why);
    }
    svc_buf_fini(&vec);
    svc_buf_fini(&mat);
    if (rc != OPS_EXIT_OK)
        ops_fail("devices", "cannot write the report");
    return rc;
}

int ops_cmd_devices(int argc, char **argv) {
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool as_json = false;
    int  c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'j') {
            as_json = true;
            continue;
        }
        fputs(DEVICES_HELP, c == 'h' ? stdout : stderr);
        return c == 'h' ? OPS_EXIT_OK : OPS_EXIT_USAGE;
    }
    if (optind < argc) {
        ops_fail("devices", "unexpected operand \"%s\": see d3stream devices --help", argv[optind]);
        return OPS_EXIT_USAGE;
    }
    return devices_print(as_json);
}

/* ------------------------------------------------------------ ask, serve, http, bench */

int ops_device_choose(const char *cmd) {
    const npu_devices_t *d = npu_devices();
    char                 why[2048];
    if (npu_device_select(d, g_device, why, sizeof why) != SVC_OK) {
        print_npu(stderr, d);
        ops_fail(cmd, "--device %s: %s: every kernel runs on the CPU (--device auto or cpu)",
                 REQ_NAME[g_device], why);
        return OPS_EXIT_FAILURE;
    }
    ops_log_t l;
    if (ops_log_begin(&l, OPS_LOG_INFO, "device")) {
        ops_log_str(&l, "requested", REQ_NAME[g_device]);
        ops_log_str(&l, "accelerator", ops_device_accelerator());
        ops_log_str(&l, "why", why);
        ops_log_end(&l);
    }
    return -1;
}

void ops_prom_device(ops_prom_t *p, bool validated) {
    svc_buf_t label;
    svc_buf_init(&label, 4096);
    if (ops_device_label(&label)) {
        p->bad = true;
        svc_buf_fini(&label);
        return;
    }
    const npu_devices_t *d = npu_devices();
    ops_prom_addf(p, "# HELP d3stream_device_info Where the kernels run: the model card's "
                     "accelerator and device, whether the golden check validated them, and "
                     "whether an XDNA NPU was found (npu_reason: why it runs nothing here).\n"
                     "# TYPE d3stream_device_info gauge\n"
                     "d3stream_device_info{accelerator=\"");
    ops_prom_label_value(p, ops_device_accelerator());
    ops_prom_addf(p, "\",device=\"");
    ops_prom_label_value(p, label.data);
    ops_prom_addf(p, "\",accelerator_validated=\"%s\",npu_present=\"%s\",npu_reason=\"",
                  validated ? "true" : "false", d->present ? "true" : "false");
    ops_prom_label_value(p, d->reason);
    ops_prom_addf(p, "\"} 1\n");
    svc_buf_fini(&label);
}
