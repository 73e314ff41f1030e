// scripts/launch.sh: the mpirun/mpiexec/srun command it builds from Megatron-DeepSpeed's
// launch variables (HOSTFILE/PBS_NODEFILE lines or SLURM_NNODES hosts, GPUS_PER_NODE or
// NGPU_PER_HOST ranks on each, as ALCF/helpers.sh counts them), read in its LAUNCH_DRY_RUN=1
// mode, and the variables' flags as omnitron resolves them (--print-config).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cli/process.h"

namespace {

const std::string kScript = std::string(OMNITRON_FIXTURE_DIR) + "/../../scripts/launch.sh";

// Runs launch.sh with only `env` among the variables it reads.
ProcessResult launch(const std::string& env, const std::string& args, bool dry_run = true) {
  const std::string clean =
      "env -u HOSTFILE -u PBS_NODEFILE -u SLURM_NNODES -u GPUS_PER_NODE -u NGPU_PER_HOST "
      "-u NPROC -u MPIRUN -u MPIRUN_ARGS -u MPI_FLAVOR -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE "
      "-u PMIX_RANK -u SLURM_STEP_NUM_TASKS ";
  return run_command(clean + (dry_run ? "LAUNCH_DRY_RUN=1 " : "") + "OMNITRON_BIN=" +
                     OMNITRON_BINARY + " " + env + " bash " + kScript + " " + args);
}

std::string hostfile(int hosts) {
  const std::string path = ::testing::TempDir() + "omnitron_hosts_" + std::to_string(hosts);
  std::ofstream out(path);
  for (int i = 0; i < hosts; ++i) out << "node" << i << "\n";
  return path;
}

TEST(LaunchScript, OneRankStartsOmnitronWithTheVariablesOn) {
  ProcessResult r = launch("", "--mock-data");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "env OMNITRON_ENV_OVERRIDES=1 " + std::string(OMNITRON_BINARY) +
                          " train --mock-data\n");
}

TEST(LaunchScript, NprocStartsThatManyRanksOnThisHost) {
  ProcessResult r = launch("NPROC=4 MPIRUN=mpirun MPI_FLAVOR=openmpi", "--mock-data");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("mpirun -np 4 bash /", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("/scripts/launch.sh --mock-data\n"), std::string::npos) << r.output;
}

TEST(LaunchScript, HostfileLinesTimesGpusPerNodeWithOpenMpi) {
  const std::string hf = hostfile(3);
  ProcessResult r = launch("MPIRUN=mpirun MPI_FLAVOR=openmpi GPUS_PER_NODE=4 HOSTFILE=" + hf, "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("mpirun -np 12 --hostfile " + hf + " --map-by ppr:4:node bash /", 0), 0u)
      << r.output;
}

TEST(LaunchScript, PbsNodefileAndNgpuPerHostWithMpich) {
  const std::string hf = hostfile(2);
  ProcessResult r =
      launch("MPIRUN=mpiexec MPI_FLAVOR=mpich NGPU_PER_HOST=6 PBS_NODEFILE=" + hf, "--x");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("mpiexec -n 12 --ppn 6 --hostfile " + hf + " bash /", 0), 0u)
      << r.output;
  // HOSTFILE wins over PBS_NODEFILE, GPUS_PER_NODE over NGPU_PER_HOST, NPROC over both.
  const std::string one = hostfile(1);
  r = launch("MPIRUN=mpiexec MPI_FLAVOR=mpich GPUS_PER_NODE=2 NGPU_PER_HOST=6 HOSTFILE=" + one +
                 " PBS_NODEFILE=" + hf,
             "");
  EXPECT_EQ(r.output.rfind("mpiexec -n 2 --ppn 2 --hostfile " + one + " bash /", 0), 0u)
      << r.output;
  r = launch("MPIRUN=mpiexec MPI_FLAVOR=mpich NPROC=3 PBS_NODEFILE=" + hf, "");
  EXPECT_EQ(r.output.rfind("mpiexec -n 3 --ppn 1 --hostfile " + hf + " bash /", 0), 0u) << r.output;
}

TEST(LaunchScript, SlurmNnodesWithoutAHostfileUsesSrun) {
  ProcessResult r = launch("SLURM_NNODES=2 GPUS_PER_NODE=4 MPIRUN_ARGS='--mpi=pmix'", "--x");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("srun -N 2 -n 8 --ntasks-per-node 4 --mpi=pmix bash /", 0), 0u)
      << r.output;
  r = launch("SLURM_NNODES=1", "--x");  // one host, one rank: no launcher
  EXPECT_EQ(r.output.rfind("env OMNITRON_ENV_OVERRIDES=1 ", 0), 0u) << r.output;
}

TEST(LaunchScript, UnderALauncherAlreadyItStartsOmnitron) {
  ProcessResult r = launch("OMPI_COMM_WORLD_SIZE=8 NPROC=8 GPUS_PER_NODE=4", "--x");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("env OMNITRON_ENV_OVERRIDES=1 ", 0), 0u) << r.output;
}

TEST(LaunchScript, BadLaunchVariablesNameThemselves) {
  ProcessResult r = launch("HOSTFILE=/no/such/hosts", "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("cannot read '/no/such/hosts'"), std::string::npos) << r.output;
  r = launch("GPUS_PER_NODE=0", "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("GPUS_PER_NODE/NGPU_PER_HOST=0: expected a positive integer"),
            std::string::npos)
      << r.output;
  r = launch("NPROC=2 MPI_FLAVOR=lam", "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("MPI_FLAVOR=lam"), std::string::npos) << r.output;
}

// Through the binary: the variables as flags, with the notes, as --print-config shows them.
TEST(LaunchScript, VariablesReachOmnitronAsFlagsWithNotes) {
  const std::string exp =
      std::string(OMNITRON_FIXTURE_DIR) + "/../../configs/examples/tiny_llama_smoke.yaml";
  ProcessResult r =
      launch("ADAM_EPS=1e-5 CLIP_GRAD=0.5 NUM_LAYERS=3 VAL_SPLIT=5 CPU_OPTIMIZER=1 OPTIM=adamw",
             "--config " + exp + " --print-config", /*dry_run=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--adam-eps 1e-5  # environment ADAM_EPS=1e-5"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--num-layers 3  # environment NUM_LAYERS=3"), std::string::npos);
  EXPECT_NE(r.output.find("--split 990,5,0  # environment VAL_SPLIT=5"), std::string::npos);
  EXPECT_NE(r.output.find("--optimizer adamw  # environment OPTIM=adamw"), std::string::npos);
  EXPECT_NE(r.output.find("note: CPU_OPTIMIZER=1: DeepSpeed's optimizer offload"),
            std::string::npos)
      << r.output;
  // A bad value stops the launch, naming the variable.
  r = launch("ADAM_EPS=tiny", "--config " + exp + " --print-config", /*dry_run=*/false);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ADAM_EPS=tiny"), std::string::npos) << r.output;
}

}  // namespace

#ifdef OMNITRON_MPIRUN
namespace {

// A real launch: one host of the hostfile with GPUS_PER_NODE=2 ranks, whose global batch
// counts both data-parallel ranks (MICRO_BATCH 1 x GRAD_ACC_STEPS 2 x 2).
TEST(LaunchScript, HostfileLaunchRunsTwoDataParallelRanks) {
  const std::string hf = ::testing::TempDir() + "omnitron_hosts_localhost";
  std::ofstream(hf) << "localhost\n";
  const ProcessResult r = launch(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 "
      "MPIRUN=" OMNITRON_MPIRUN " MPIRUN_ARGS=--oversubscribe HOSTFILE=" +
          hf +
          " GPUS_PER_NODE=2 MICRO_BATCH=1 GRAD_ACC_STEPS=2 NUM_LAYERS=2 HIDDEN=32 NHEADS=4 "
          "SEQ=16 TRAIN_ITER=2 EVAL_ITERS=0 timeout -k 10 120",
      "--mock-data --vocab-size 64 --tokenizer-type NullTokenizer --max-position-embeddings 16 "
      "--no-progress",
      /*dry_run=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("layout: 2 ranks = tensor 1 x context 1 x pipeline 1 x data 2"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("batch: 4 x 16 tokens (micro batch 1, 2 accumulation steps)"),
            std::string::npos)
      << r.output;
}

}  // namespace
#endif
