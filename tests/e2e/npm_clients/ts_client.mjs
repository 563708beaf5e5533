// One scenario through the official TypeScript SDK (1.x "@modelcontextprotocol/sdk" or the 2.x
// "@modelcontextprotocol/client"), over stdio or streamable HTTP. Prints one JSON report line;
// the Python test asserts on it. Usage:
//   node ts_client.mjs v1|v2 stdio <python> <hyphae home>     (HYPHAE_API_KEY in the environment)
//   node ts_client.mjs v1|v2 http <mcp url>                    (HYPHAE_API_KEY in the environment)
import { readFileSync } from "node:fs";

const [line, transportKind, ...target] = process.argv.slice(2);
const key = process.env.HYPHAE_API_KEY;
const installed = (name) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url))).version;

async function load() {
  if (line === "v1") {
    const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
    const { StdioClientTransport } = await import("@modelcontextprotocol/sdk/client/stdio.js");
    const { StreamableHTTPClientTransport } = await import("@modelcontextprotocol/sdk/client/streamableHttp.js");
    return { Client, StdioClientTransport, StreamableHTTPClientTransport, version: installed("@modelcontextprotocol/sdk") };
  }
  const { Client, StreamableHTTPClientTransport } = await import("@modelcontextprotocol/client");
  const { StdioClientTransport } = await import("@modelcontextprotocol/client/stdio");
  return { Client, StdioClientTransport, StreamableHTTPClientTransport, version: installed("@modelcontextprotocol/client") };
}

const sdk = await load();
const transport = transportKind === "stdio"
  ? new sdk.StdioClientTransport({
      command: target[0], args: ["-m", "app.cli", "--home", target[1], "mcp"],
      env: { HYPHAE_API_KEY: key, PATH: process.env.PATH }, stderr: "inherit",
    })
  : new sdk.StreamableHTTPClientTransport(new URL(target[0]), { requestInit: { headers: { "x-hyphae-key": key } } });
const client = new sdk.Client({ name: "hyphae-e2e", version: "0.0.0" });
await client.connect(transport);

const report = { sdk: sdk.version, server: client.getServerVersion()?.name };
report.tools = (await client.listTools()).tools.map((tool) => tool.name).sort();
const content = `The TypeScript ${line} client stores this over ${transportKind} (${Date.now()}).`;
const stored = await client.callTool({ name: "store", arguments: { content, cell_type: "Fact" } });
report.stored = stored.structuredContent.node_id;
const recalled = await client.callTool({ name: "recall", arguments: { query: content, k: 3 } });
report.results = recalled.structuredContent.results;
report.blocks = recalled.content.map((block) => block.type);
const link = recalled.content.find((block) => block.type === "resource_link");
report.link = link.uri;
const read = await client.readResource({ uri: link.uri });
report.read = { mimeType: read.contents[0].mimeType, cell: JSON.parse(read.contents[0].text) };
report.content = content;
report.resources = (await client.listResources()).resources.map((resource) => resource.uri);
report.templates = (await client.listResourceTemplates()).resourceTemplates.map((t) => t.uriTemplate);
const prompts = (await client.listPrompts()).prompts;
report.prompts = {};
for (const prompt of prompts) {
  const args = Object.fromEntries((prompt.arguments ?? []).filter((a) => a.required).map((a) => [a.name, "x"]));
  const got = await client.getPrompt({ name: prompt.name, arguments: args });
  report.prompts[prompt.name] = got.messages.map((message) => message.content.type);
}
const bad = await client.callTool({ name: "recall", arguments: { query: "anything", k: 1000 } });
report.bad = { isError: bad.isError, text: bad.content[0].text };
await client.close();
console.log(JSON.stringify(report));
