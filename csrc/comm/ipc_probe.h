// Whether this process's GPU can write into another process's GPU memory through CUDA IPC, asked
// once at lowering before a call of several processes is given the copy-engine transport
// (fo_jax/_process_layout.py, ipc_probe): each process exports a small buffer of its own GPU,
// every other process maps it, writes a word into its slot with a device-to-device copy (the
// copy engine's path: peer writes over NVLink) and reads the word back. A pair that cannot (no
// peer access, a GPU hidden by CUDA_VISIBLE_DEVICES, IPC refused between the processes) then
// makes every process choose NCCL at lowering, instead of failing the call at its first run.
#pragma once

#include <cstdint>
#include <string>

namespace fo_jax {

// Bytes of one probe buffer: one 32-bit slot per process that may write into it.
constexpr int kIpcProbeBytes = 4096;

struct IpcProbeExport {
  std::string handle;   // the raw cudaIpcMemHandle_t bytes ("" when the export failed)
  std::string problem;  // why the export failed, else ""
};

// Each function works on a thread of its own, with `device` current there: the caller's current
// device is left as it was.

// Allocates this process's probe buffer on `device` (one per device, kept until
// ReleaseIpcProbes) and exports it.
IpcProbeExport ExportIpcProbe(int device);

// From `device`: maps `handle` (another process's ExportIpcProbe), copies `word` into its 32-bit
// slot `slot` from this GPU's memory, reads the slot back and unmaps the buffer. "" when the word
// came back, else why not.
std::string TryIpcProbe(int device, const std::string& handle, int slot, uint32_t word);

// Frees this process's probe buffers (once every peer has tried them).
void ReleaseIpcProbes();

}  // namespace fo_jax
