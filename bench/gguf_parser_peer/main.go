// gguf_parser_peer prints gguf-parser-go's llama.cpp memory estimate for one configuration
// as JSON, so bench/estimate_accuracy.py can show it beside tierlocal's and llama.cpp's own
// figures. A measurement peer only; tierlocal itself is Python.
//
// Usage: gguf_parser_peer MODEL.gguf CTX PARALLEL NGL CACHE_TYPE FLASH_ATTN(0|1)
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	parser "github.com/gpustack/gguf-parser-go"
)

func main() {
	if len(os.Args) != 7 {
		fmt.Fprintln(os.Stderr, "usage: gguf_parser_peer MODEL.gguf CTX PARALLEL NGL CACHE_TYPE FLASH_ATTN")
		os.Exit(2)
	}
	ctx, _ := strconv.Atoi(os.Args[2])
	parallel, _ := strconv.Atoi(os.Args[3])
	ngl, _ := strconv.Atoi(os.Args[4])
	cacheType := parser.GGMLTypeF16
	switch os.Args[5] {
	case "q8_0":
		cacheType = parser.GGMLTypeQ8_0
	case "q4_0":
		cacheType = parser.GGMLTypeQ4_0
	}
	gf, err := parser.ParseGGUFFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	opts := []parser.GGUFRunEstimateOption{
		parser.WithLLaMACppContextSize(int32(ctx)),
		parser.WithParallelSize(int32(parallel)),
		parser.WithLLaMACppOffloadLayers(uint64(ngl)),
		parser.WithLLaMACppCacheKeyType(cacheType),
		parser.WithLLaMACppCacheValueType(cacheType),
	}
	if os.Args[6] == "1" {
		opts = append(opts, parser.WithFlashAttention())
	}
	estimate := gf.EstimateLLaMACppRun(opts...)
	if err := json.NewEncoder(os.Stdout).Encode(estimate.Devices); err != nil {
		os.Exit(1)
	}
}
