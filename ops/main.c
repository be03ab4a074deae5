/*
 * main.c -- `d3stream <command> [options]`.
 */
#include "ops.h"

#ifndef D3_VERSION
#define D3_VERSION "dev"
#endif

static const char USAGE[] =
    "d3stream " D3_VERSION " -- System One decisions over event streams\n"
    "\n"
    "Usage: d3stream <command> [options]\n"
    "\n"
    "Commands:\n"
    "  ask       answer a request with a package: the exact response body\n"
    "  inspect   a package's format, architecture, parameters and manifest verdict\n"
    "  prompt    render a request's questions into the exact model prompts and\n"
    "            token ids (needs a package's tokenizer and decision_config.json)\n"
    "  validate  the contract's verdict on a request, without a model\n"
    "  tokenize  token ids of text, with a package's tokenizer.json\n"
    "  version   version and the compute features of this machine\n"
    "  make-package  a synthetic package with random weights (meaningless answers)\n"
    "  quantize  an upstream BF16 package -> a q4nx package (GPTQ or round to nearest)\n"
    "  serve     answer requests from a Kafka topic onto a results topic (at least or exactly "
    "once)\n"
    "  http      serve the System One HTTP API (POST /v1/systemone, port 52625)\n"
    "  config    the effective configuration of serve or http (file < env < flags),\n"
    "            secrets masked\n"
    "  bench     D3-Nano-NPU2's text speed table measured on a package on this machine\n"
    "\n"
    "'d3stream <command> --help' explains each command.\n";

typedef int (*cmd_fn)(int argc, char **argv);

static const struct {
    const char *name;
    cmd_fn      fn;
} COMMANDS[] = {
    {"ask", ops_cmd_ask},
    {"inspect", ops_cmd_inspect},
    {"prompt", ops_cmd_prompt},
    {"validate", ops_cmd_validate},
    {"tokenize", ops_cmd_tokenize},
    {"version", ops_cmd_version},
    {"make-package", ops_cmd_make_package},
    {"quantize", ops_cmd_quantize},
    {"serve", ops_cmd_serve},
    {"http", ops_cmd_http},
    {"config", ops_cmd_config},
    {"bench", ops_cmd_bench},
};

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? OPS_EXIT_USAGE : OPS_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version"))
        return ops_cmd_version(1, argv + 1);
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(argv[1], COMMANDS[i].name))
            return COMMANDS[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "d3stream: unknown command \"%s\"\n\n%s", argv[1], USAGE);
    return OPS_EXIT_USAGE;
}
