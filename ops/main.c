/*
 * main.c -- `d3stream <command> [options]`.
 */
#include "ops.h"
#include "ops_int.h" /* ops_log_init: main is ops' own */

#ifndef D3_VERSION
#define D3_VERSION "dev"
#endif

typedef int (*cmd_fn)(int argc, char **argv);

/* In the README's order (its "Commands" block; test_ops checks the two
 * agree), one line each. */
static const struct {
    const char *name;
    cmd_fn      fn;
    const char *summary;
} COMMANDS[] = {
    {"serve", ops_cmd_serve, "answer requests from a Kafka topic onto a results topic"},
    {"http", ops_cmd_http, "serve the System One HTTP API (POST /v1/systemone, port 52625)"},
    {"ask", ops_cmd_ask, "answer one request with a package: the exact response body"},
    {"inspect", ops_cmd_inspect,
     "a package's format, architecture, parameters and manifest verdict"},
    {"bench", ops_cmd_bench, "D3-Nano-NPU2's speed table, measured on a package on this machine"},
    {"quantize", ops_cmd_quantize,
     "an upstream BF16 package to a q4nx package (GPTQ or round to nearest)"},
    {"make-package", ops_cmd_make_package,
     "a synthetic package with random weights (meaningless answers)"},
    {"config", ops_cmd_config, "the effective configuration of serve or http, secrets masked"},
    {"validate", ops_cmd_validate, "the contract's verdict on a request, without a model"},
    {"prompt", ops_cmd_prompt, "a request's questions as the exact prompts and token ids"},
    {"tokenize", ops_cmd_tokenize, "token ids of text, with a package's tokenizer.json"},
    {"version", ops_cmd_version, "the version, and the CPU features and kernels of this machine"},
    {"devices", ops_cmd_devices,
     "what runs where: the CPU's kernels, the XDNA NPU and XRT as found"},
};
#define N_COMMANDS (sizeof COMMANDS / sizeof COMMANDS[0])

static void usage(FILE *f) {
    fputs("d3stream " D3_VERSION " -- System One decisions over event streams\n"
          "\n"
          "Usage: d3stream <command> [options]\n"
          "\n"
          "Commands:\n",
          f);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-13s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fputs("\n'd3stream <command> --help' explains each command.\n", f);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? OPS_EXIT_USAGE : OPS_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version"))
        return ops_cmd_version(1, argv + 1);
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], COMMANDS[i].name)) {
            /* every log line names its command (serve and http set their
             * level again from --log-level) */
            ops_log_init(COMMANDS[i].name, OPS_LOG_INFO);
            return COMMANDS[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "d3stream: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return OPS_EXIT_USAGE;
}
