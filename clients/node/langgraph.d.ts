// Types of langgraph.js: a LangGraph.js checkpointer on the ckpt sidecar.
import type { RunnableConfig } from '@langchain/core/runnables';
import { BaseCheckpointSaver } from '@langchain/langgraph-checkpoint';
import type {
  ChannelVersions,
  Checkpoint,
  CheckpointListOptions,
  CheckpointMetadata,
  CheckpointTuple,
  PendingWrite,
  SerializerProtocol,
} from '@langchain/langgraph-checkpoint';
import type { CheckpointClient, ClientOptions } from './ckpt_client';

/** What put throws when another writer moved the thread's head since this saver read it. */
export declare class CheckpointConflictError extends Error {
  name: 'CheckpointConflictError';
  threadId: string;
  checkpointNs: string;
  /** The thread namespace's head version at the time of the refused write. */
  currentVersion: number;
  constructor(message: string, fields: { threadId: string; checkpointNs: string; currentVersion: number });
}

export interface CkptSaverOptions extends ClientOptions {
  /** LangGraph's serializer; JsonPlusSerializer by default. */
  serde?: SerializerProtocol;
}

export declare class CkptSaver extends BaseCheckpointSaver {
  /** `target`: a sidecar ('unix:/path/ckpt.sock', 'localhost:50051'), or a client to use (close() leaves it open). */
  constructor(target: string | CheckpointClient, options?: CkptSaverOptions);
  static fromConnString(target: string, options?: CkptSaverOptions): CkptSaver;
  readonly client: CheckpointClient;
  getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined>;
  list(config: RunnableConfig, options?: CheckpointListOptions): AsyncGenerator<CheckpointTuple>;
  /** Throws CheckpointConflictError when the checkpoint continues a head another writer moved. */
  put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    newVersions: ChannelVersions,
  ): Promise<RunnableConfig>;
  putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string, taskPath?: string): Promise<void>;
  /** Removes every checkpoint namespace of the thread, with its writes. */
  deleteThread(threadId: string | number): Promise<void>;
  /** Closes the client this saver made (not one it was given). */
  close(): void;
}
