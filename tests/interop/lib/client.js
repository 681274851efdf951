// The ldp.v1 device and operator calls over gRPC, with the rich error model of docs/errors.md:
// a failed call becomes an RpcFailure holding its status code, the ErrorInfo reason (domain
// "ldp.v1"), the BadRequest field paths and the RetryInfo delay.
import grpc from "@grpc/grpc-js";
import { SUPPORTED } from "./capabilities.js";
import { Unsupported } from "./encoders.js";
import { decode, load } from "./proto.js";

export const DOMAIN = "ldp.v1";
const STATUS_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));
const DETAIL_PREFIX = "type.googleapis.com/";

/** A call that failed, read as docs/errors.md sections 2, 3 and 6 describe. */
export class RpcFailure extends Error {
  constructor(error, status) {
    super(`${STATUS_NAMES[error.code] ?? error.code}: ${error.details}`);
    this.code = error.code;
    this.codeName = STATUS_NAMES[error.code] ?? String(error.code);
    this.details = error.details;
    this.status = status; // the decoded google.rpc.Status, or null without details
    const infos = detailsOf(status, "google.rpc.ErrorInfo");
    // A reason means what the table says only in the ldp.v1 domain (section 2).
    const own = infos.filter((info) => info.domain === DOMAIN);
    this.errorInfos = infos;
    this.reason = own.length > 0 ? own[0].reason : null;
    this.fieldViolations = detailsOf(status, "google.rpc.BadRequest").flatMap((b) => b.field_violations);
    const retries = detailsOf(status, "google.rpc.RetryInfo");
    this.retryDelayMs = retries.length > 0 ? durationMs(retries[0].retry_delay) : null;
    this.preconditionFailures = detailsOf(status, "google.rpc.PreconditionFailure");
    this.quotaFailures = detailsOf(status, "google.rpc.QuotaFailure");
  }
}

function durationMs(duration) {
  if (duration === null || duration === undefined) return 0;
  return Number(duration.seconds) * 1000 + Math.floor(duration.nanos / 1e6);
}

function detailsOf(status, fullName) {
  if (status === null) return [];
  return status.details
    .filter((any) => any.type_url === DETAIL_PREFIX + fullName)
    .map((any) => decode(fullName, any.value));
}

function asFailure(error) {
  const raw = error.metadata?.get("grpc-status-details-bin") ?? [];
  const status = raw.length > 0 ? decode("google.rpc.Status", raw[0]) : null;
  return new RpcFailure(error, status);
}

function unary(stub, method, request, metadata, deadlineS = 60) {
  return new Promise((resolve, reject) => {
    const options = { deadline: new Date(Date.now() + deadlineS * 1000) };
    stub[method](request, metadata, options, (error, response) => {
      if (error) reject(asFailure(error));
      else resolve(response);
    });
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** One connection to a collector: the device calls and, with a token, the operator calls. */
export class Collector {
  constructor(address, { operatorToken = null, deviceToken = null, capabilities = SUPPORTED } = {}) {
    this.capabilities = capabilities;
    const v1 = load().tree.ldp.v1;
    const credentials = grpc.credentials.createInsecure();
    this.device = new v1.DeviceService(address, credentials);
    this.operator = new v1.OperatorService(address, credentials);
    this.health = new (load().tree.grpc.health.v1.Health)(address, credentials);
    this.operatorMetadata = bearer(operatorToken);
    this.deviceMetadata = bearer(deviceToken);
  }

  close() {
    this.device.close();
    this.operator.close();
    this.health.close();
  }

  healthCheck(service = "") {
    return unary(this.health, "Check", { service }, new grpc.Metadata());
  }

  // -- operator (docs/errors.md; service.proto OperatorService) --
  createCampaign(config) {
    return unary(this.operator, "CreateCampaign", { config }, this.operatorMetadata);
  }
  getCampaign(campaignId) {
    return unary(this.operator, "GetCampaign", { campaign_id: campaignId }, this.operatorMetadata);
  }
  closeRound(campaignId, round) {
    return unary(this.operator, "CloseRound", { campaign_id: campaignId, round }, this.operatorMetadata, 600);
  }
  getEstimates(campaignId, round = 0, confidence = 0) {
    return unary(this.operator, "GetEstimates", { campaign_id: campaignId, round, confidence },
      this.operatorMetadata);
  }
  getOperatorResult(campaignId) {
    return unary(this.operator, "GetResult", { campaign_id: campaignId }, this.operatorMetadata);
  }

  // -- device --
  getRoundSpecOnce(campaignId) {
    // §10.3: the device states what it runs (a collector older than the field ignores it).
    return unary(this.device, "GetRoundSpec", { campaign_id: campaignId, supported_capabilities: this.capabilities },
      this.deviceMetadata);
  }

  /**
   * The open round's spec, `{finished: true}`, after waiting through the gap between two rounds
   * (docs/protocol.md section 1: UNAVAILABLE with ROUND_NOT_OPEN is "not yet"; an answer with neither
   * spec nor finished, from older collectors, too).
   */
  async getRoundSpec(campaignId, { maxWaitMs = 300_000 } = {}) {
    const started = Date.now();
    for (;;) {
      let delayMs = 1000;
      try {
        const response = await this.getRoundSpecOnce(campaignId);
        if (response.finished) return { finished: true, spec: null };
        if (response.spec) return { finished: false, spec: response.spec, assignment: response.assignment };
      } catch (error) {
        if (error instanceof RpcFailure && error.reason === "MISSING_CAPABILITIES") {
          // §10.3: not this round; the device reports nothing and is charged nothing.
          const missing = error.errorInfos.find((info) => info.domain === DOMAIN)?.metadata?.missing_capabilities;
          throw new Unsupported(`capabilities ${missing ?? "(unnamed)"}`);
        }
        if (!(error instanceof RpcFailure) || error.codeName !== "UNAVAILABLE") throw error;
        delayMs = error.retryDelayMs ?? 1000;
      }
      if (Date.now() - started > maxWaitMs) throw new Error(`no round of ${campaignId} opened in ${maxWaitMs} ms`);
      await sleep(delayMs * (1 + 0.2 * Math.random()));
    }
  }

  submitReports(requestId, reports) {
    return unary(this.device, "SubmitReports", { request_id: requestId, reports }, this.deviceMetadata);
  }
  submitPacked(requestId, packed) {
    return unary(this.device, "SubmitPacked", { request_id: requestId, packed }, this.deviceMetadata);
  }
  getResult(campaignId) {
    return unary(this.device, "GetResult", { campaign_id: campaignId }, this.deviceMetadata);
  }
}

function bearer(token) {
  const metadata = new grpc.Metadata();
  if (token) metadata.set("authorization", `Bearer ${token}`);
  return metadata;
}
